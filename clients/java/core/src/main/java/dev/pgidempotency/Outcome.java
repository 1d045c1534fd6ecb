package dev.pgidempotency;

/** What {@code idem_claim} answered (the contract's outcome words). */
public enum Outcome {
    CLAIMED("claimed"),
    RECLAIMED("reclaimed"),
    REPLAY("replay"),
    IN_PROGRESS("in_progress"),
    MISMATCH("mismatch"),
    EXPIRED("expired");

    private final String word;

    Outcome(String word) {
        this.word = word;
    }

    /** The outcome word as the database writes it. */
    public String word() {
        return word;
    }

    /** Whether the caller now owns the key and runs the operation. */
    public boolean owns() {
        return this == CLAIMED || this == RECLAIMED;
    }

    public static Outcome of(String word) {
        for (Outcome o : values()) {
            if (o.word.equals(word)) {
                return o;
            }
        }
        throw new IllegalArgumentException("unknown claim outcome '" + word + "'");
    }
}
