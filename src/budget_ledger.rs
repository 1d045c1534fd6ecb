//! The retry budget's counts as one backend keeps them until they are written to
//! idempotency.outbound_budget (docs/sending.md, "The retry budget"). Pure: the glue
//! (src/api/send_budget.rs) feeds it the transaction's events and writes what it says.
//!
//! The counts that make retries possible (first attempts, final answers) are kept here across
//! transactions and written once per bucket (a sixtieth of the window, a second by default),
//! not once per send: a send then writes no budget row. The counts that hold retries back
//! (retries handed out, retryable answers) are written at once, in the transaction that made
//! them, as the portable edition writes every count; so is everything of a target before its
//! budget is read. What is kept follows the transaction: counts made in a (sub)transaction that
//! rolls back are forgotten, and so is the writing of counts that a rollback undid (they are
//! kept again, to be written later).

use std::collections::BTreeMap;

/// What one backend counted for one target in one bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub first_attempts: i64,
    pub retries: i64,
    pub final_answers: i64,
    pub retryable_answers: i64,
}

impl Counts {
    fn plus(self, o: Counts) -> Counts {
        Counts {
            first_attempts: self.first_attempts + o.first_attempts,
            retries: self.retries + o.retries,
            final_answers: self.final_answers + o.final_answers,
            retryable_answers: self.retryable_answers + o.retryable_answers,
        }
    }

    fn minus(self, o: Counts) -> Counts {
        Counts {
            first_attempts: self.first_attempts - o.first_attempts,
            retries: self.retries - o.retries,
            final_answers: self.final_answers - o.final_answers,
            retryable_answers: self.retryable_answers - o.retryable_answers,
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

/// A target and the start of a bucket (microseconds since 2000-01-01).
pub type Slot = (String, i64);

/// A subtransaction's id (PostgreSQL's SubTransactionId; the top level is 1).
pub type Sub = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Counted,
    Written,
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// Counted by transactions that committed, not written yet.
    committed: BTreeMap<Slot, Counts>,
    /// The open transaction's counts and writes, each with the subtransaction that made it.
    changes: Vec<(Sub, Change, Slot, Counts)>,
}

impl Ledger {
    pub fn count(&mut self, sub: Sub, slot: Slot, counts: Counts) {
        if !counts.is_zero() {
            self.changes.push((sub, Change::Counted, slot, counts));
        }
    }

    /// Counted and not yet written, per slot, for the slots `which` selects (slot order).
    pub fn unwritten(&self, which: impl Fn(&Slot) -> bool) -> Vec<(Slot, Counts)> {
        let mut due: BTreeMap<&Slot, Counts> =
            self.committed.iter().filter(|(slot, _)| which(slot)).map(|(s, c)| (s, *c)).collect();
        for (_, change, slot, counts) in &self.changes {
            if which(slot) {
                let c = due.entry(slot).or_default();
                *c = match change {
                    Change::Counted => c.plus(*counts),
                    Change::Written => c.minus(*counts),
                };
            }
        }
        due.into_iter().filter(|(_, c)| !c.is_zero()).map(|(s, c)| (s.clone(), c)).collect()
    }

    /// `rows` (what `unwritten` gave) were written in subtransaction `sub`.
    pub fn written(&mut self, sub: Sub, rows: &[(Slot, Counts)]) {
        for (slot, counts) in rows {
            self.changes.push((sub, Change::Written, slot.clone(), *counts));
        }
    }

    /// Whether a committed transaction's counts wait in a bucket that started before `bucket`.
    pub fn waiting_before(&self, bucket: i64) -> bool {
        self.committed.keys().any(|(_, b)| *b < bucket)
    }

    pub fn subtransaction_committed(&mut self, sub: Sub, parent: Sub) {
        for change in self.changes.iter_mut().filter(|c| c.0 == sub) {
            change.0 = parent;
        }
    }

    pub fn subtransaction_aborted(&mut self, sub: Sub) {
        self.changes.retain(|c| c.0 != sub);
    }

    /// The transaction committed (or was prepared): what it counted and did not write waits
    /// for a later one; what it wrote is written.
    pub fn transaction_committed(&mut self) {
        for (_, change, slot, counts) in std::mem::take(&mut self.changes) {
            let c = self.committed.entry(slot.clone()).or_default();
            *c = match change {
                Change::Counted => c.plus(counts),
                Change::Written => c.minus(counts),
            };
            if c.is_zero() {
                self.committed.remove(&slot);
            }
        }
    }

    pub fn transaction_aborted(&mut self) {
        self.changes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn firsts(n: i64) -> Counts {
        Counts { first_attempts: n, ..Counts::default() }
    }

    fn finals(n: i64) -> Counts {
        Counts { final_answers: n, ..Counts::default() }
    }

    fn slot(target: &str, bucket: i64) -> Slot {
        (target.to_string(), bucket)
    }

    fn all(l: &Ledger) -> Vec<(Slot, Counts)> {
        l.unwritten(|_| true)
    }

    #[test]
    fn counts_of_committed_transactions_wait_and_add_up() {
        let mut l = Ledger::default();
        l.count(1, slot("t", 0), firsts(1));
        l.transaction_committed();
        l.count(1, slot("t", 0), firsts(2));
        l.count(1, slot("t", 0), finals(1));
        l.transaction_committed();
        assert_eq!(
            all(&l),
            vec![(slot("t", 0), Counts { first_attempts: 3, final_answers: 1, ..Counts::default() })]
        );
        assert!(l.waiting_before(1));
        assert!(!l.waiting_before(0));
    }

    #[test]
    fn a_rollback_forgets_its_counts() {
        let mut l = Ledger::default();
        l.count(1, slot("t", 0), firsts(1));
        l.transaction_committed();
        l.count(1, slot("t", 0), firsts(5));
        l.transaction_aborted();
        assert_eq!(all(&l), vec![(slot("t", 0), firsts(1))]);
    }

    #[test]
    fn written_counts_are_gone_once_the_writing_commits() {
        let mut l = Ledger::default();
        l.count(1, slot("t", 0), firsts(2));
        l.transaction_committed();
        l.count(1, slot("t", 1), firsts(1));
        let due = l.unwritten(|s| s.1 < 1);
        assert_eq!(due, vec![(slot("t", 0), firsts(2))]);
        l.written(1, &due);
        assert_eq!(all(&l), vec![(slot("t", 1), firsts(1))]);
        l.transaction_committed();
        assert_eq!(all(&l), vec![(slot("t", 1), firsts(1))]);
        assert!(!l.waiting_before(1));
    }

    #[test]
    fn a_rolled_back_write_is_written_again_later() {
        let mut l = Ledger::default();
        l.count(1, slot("t", 0), firsts(2));
        l.transaction_committed();
        let due = all(&l);
        l.written(1, &due);
        assert!(all(&l).is_empty());
        l.transaction_aborted();
        assert_eq!(all(&l), vec![(slot("t", 0), firsts(2))]);
    }

    #[test]
    fn the_open_transactions_counts_can_be_written_in_it() {
        let mut l = Ledger::default();
        l.count(1, slot("t", 0), firsts(3));
        let due = l.unwritten(|s| s.0 == "t");
        assert_eq!(due, vec![(slot("t", 0), firsts(3))]);
        l.written(1, &due);
        l.transaction_committed();
        assert!(all(&l).is_empty());
    }

    #[test]
    fn subtransactions_that_roll_back_take_their_counts_and_writes_back() {
        let mut l = Ledger::default();
        l.count(1, slot("t", 0), firsts(1));
        l.count(2, slot("t", 0), firsts(10));
        l.subtransaction_aborted(2);
        l.count(3, slot("t", 0), firsts(100));
        l.subtransaction_committed(3, 1);
        // A write in subtransaction 4 of what 1 and 3 counted, rolled back.
        let due = all(&l);
        assert_eq!(due, vec![(slot("t", 0), firsts(101))]);
        l.written(4, &due);
        l.subtransaction_aborted(4);
        assert_eq!(all(&l), vec![(slot("t", 0), firsts(101))]);
        // Written again in 5, which commits into 1.
        let due = all(&l);
        l.written(5, &due);
        l.subtransaction_committed(5, 1);
        l.transaction_committed();
        assert!(all(&l).is_empty());
    }

    #[test]
    fn targets_and_buckets_are_kept_apart() {
        let mut l = Ledger::default();
        l.count(1, slot("b", 0), firsts(1));
        l.count(1, slot("a", 1), finals(1));
        l.count(1, slot("a", 0), firsts(1));
        l.count(1, slot("a", 0), Counts::default());
        l.transaction_committed();
        assert_eq!(
            all(&l),
            vec![(slot("a", 0), firsts(1)), (slot("a", 1), finals(1)), (slot("b", 0), firsts(1))]
        );
        assert_eq!(l.unwritten(|s| s.0 == "a").len(), 2);
    }
}
