package idempotency

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// README.md shows examples/orders/main.go (run by examples/orders/outage_test.go and by the
// suite artifacts-go) as it is, and installs this module's Version.
func TestReadmeExampleIsTheFile(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)<!-- file: ([^ ]+) -->\n```go\n(.*?)```\n").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("README.md shows no file (<!-- file: PATH --> before a go block)")
	}
	for _, b := range blocks {
		file, err := os.ReadFile(b[1])
		if err != nil {
			t.Errorf("README.md shows %s: %v", b[1], err)
			continue
		}
		if string(file) != b[2] {
			t.Errorf("README.md's block differs from %s: copy the file into it", b[1])
		}
	}
	if want := "go get github.com/idempotency/pg-idempotency-go@v" + Version + "\n"; !strings.Contains(string(readme), want) {
		t.Errorf("README.md does not install this version: no %q", want)
	}
}
