//! The words of an idempotency record that SQL shows: a claim's outcome
//! (`idempotency.claim_result.outcome`) and a record's status (`idempotency.keys.status`).

/// What idem_claim answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The key was free (absent or expired): the caller owns a new claim.
    Claimed,
    /// The previous owner's lease ended: the caller took the claim over.
    Reclaimed,
    /// Completed before: here is the stored response.
    Replay,
    /// Another owner holds a live lease.
    InProgress,
    /// The key was used with another request fingerprint.
    Mismatch,
    /// Tombstones on: the record was completed and has expired, but its tombstone lasts.
    Expired,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Claimed => "claimed",
            Outcome::Reclaimed => "reclaimed",
            Outcome::Replay => "replay",
            Outcome::InProgress => "in_progress",
            Outcome::Mismatch => "mismatch",
            Outcome::Expired => "expired",
        }
    }
}

/// A record's status column. The statements spell the same words in their SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    InProgress,
    Completed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
        }
    }

    /// A stored status (the idem_* functions write only these two).
    pub fn parse(text: &str) -> Option<Status> {
        match text {
            "in_progress" => Some(Status::InProgress),
            "completed" => Some(Status::Completed),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_the_contracts_words() {
        let all = [
            Outcome::Claimed,
            Outcome::Reclaimed,
            Outcome::Replay,
            Outcome::InProgress,
            Outcome::Mismatch,
            Outcome::Expired,
        ];
        let words: Vec<&str> = all.iter().map(|o| o.as_str()).collect();
        assert_eq!(words, ["claimed", "reclaimed", "replay", "in_progress", "mismatch", "expired"]);
    }

    #[test]
    fn statuses_are_the_tables_words() {
        assert_eq!(Status::parse("in_progress"), Some(Status::InProgress));
        assert_eq!(Status::parse("completed"), Some(Status::Completed));
        assert_eq!(Status::parse("done"), None);
        for status in [Status::InProgress, Status::Completed] {
            assert_eq!(Status::parse(status.as_str()), Some(status));
        }
    }
}
