package example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * clients/java/README.md shows the example apps exactly: each block after a marker
 * {@code <!-- file: PATH -->} (PATH from clients/java) is that file, byte for byte.
 */
class ReadmeTest {
    private static final Path JAVA = Path.of("..");
    private static final Pattern SHOWN = Pattern.compile("<!-- file: (\\S+) -->\\n```[a-z]*\\n(.*?)```\\n", Pattern.DOTALL);

    @Test
    void theReadmeShowsTheExampleFilesAsTheyAre() throws IOException {
        String readme = Files.readString(JAVA.resolve("README.md"));
        Matcher m = SHOWN.matcher(readme);
        List<String> shown = new ArrayList<>();
        while (m.find()) {
            shown.add(m.group(1));
            assertEquals(Files.readString(JAVA.resolve(m.group(1))), m.group(2), m.group(1) + " as the README shows it");
        }
        assertTrue(shown.contains("examples/src/main/java/example/OrdersApplication.java"), shown.toString());
        assertTrue(shown.contains("examples/src/main/java/example/OrdersServer.java"), shown.toString());
    }
}
