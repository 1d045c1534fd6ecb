//! The key lock: what makes a new record of (scope, key) unique before any row exists.
//!
//! A claim that may create a record, or a deferred claim that holds a key without writing it,
//! first takes a transaction-level exclusive lock on a 64-bit hash of (scope, key), in a lock
//! space of the extension's own: an advisory lock tag whose fourth field is KEY_SPACE, which
//! the SQL advisory lock functions never use (they use 1 and 2), so no application lock can
//! collide with it. A second claim of the same key waits for it as it would on a unique index
//! (lock_timeout gives 55P03, a cycle 40P01), then reads the record again under a fresh
//! snapshot. Two keys whose hashes collide only wait for each other; the answers come from the
//! records, never from the lock. pg_locks shows the lock as `advisory` with objsubid KEY_SPACE
//! (7649; message ids of idem_seen: 7650).

use pgrx::pg_sys;

use crate::settings;

/// field4 of the tags: 1 and 2 are taken by pg_advisory_lock's two key forms, 0x1DE0 by the
/// wake-ups of waiting claims (src/wakeup.rs).
pub const KEY_SPACE: u16 = 0x1DE1;

/// Which records a lock holds: keys (a claim's) or message ids (idem_seen's), each in a lock
/// space of its own.
#[derive(Clone, Copy)]
pub enum Space {
    Keys,
    Messages,
}

impl Space {
    fn field4(self) -> u16 {
        match self {
            Space::Keys => KEY_SPACE,
            Space::Messages => KEY_SPACE + 1,
        }
    }
}

/// The 64-bit FNV-1a hash of (scope, key), keeping the low `bits` bits (1..=64). A byte that
/// UTF-8 never uses separates the two, so ("ab", "c") and ("a", "bc") differ.
pub fn hash(scope: &str, key: &str, bits: u32) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in scope.bytes().chain(std::iter::once(0xFF)).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    if bits >= 64 {
        h
    } else {
        h & ((1u64 << bits) - 1)
    }
}

fn tag(space: Space, scope: &str, key: &str) -> pg_sys::LOCKTAG {
    let h = hash(scope, key, settings::key_lock_bits());
    pg_sys::LOCKTAG {
        // SAFETY: a plain read of the backend's database oid.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (h >> 32) as u32,
        locktag_field3: h as u32,
        locktag_field4: space.field4(),
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Takes the key lock of (scope, key) until the transaction ends (or the subtransaction that
/// took it aborts), waiting for the transaction that holds it. Taking it again is free.
pub fn lock(space: Space, scope: &str, key: &str) {
    let tag = tag(space, scope, key);
    // SAFETY: a transaction-level lock of the user lock method; a wait honours lock_timeout,
    // deadlock detection and cancel, each of which raises an ERROR.
    unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, false);
    }
}

/// Takes the key lock of (scope, key) if nobody holds it; false (and nothing taken) if
/// somebody does.
pub fn try_lock(space: Space, scope: &str, key: &str) -> bool {
    let tag = tag(space, scope, key);
    // SAFETY: as in `lock`, with dontWait: it never blocks.
    let got = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true) };
    got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_over_scope_separator_key() {
        // FNV-1a 64 of the empty input is its offset basis; of the single byte 0xFF:
        assert_eq!(hash("", "", 64), {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            h ^= 0xFF;
            h.wrapping_mul(0x0000_0100_0000_01b3)
        });
        assert_ne!(hash("ab", "c", 64), hash("a", "bc", 64));
        assert_ne!(hash("s", "k1", 64), hash("s", "k2", 64));
        assert_eq!(hash("s", "k1", 64), hash("s", "k1", 64));
    }

    #[test]
    fn fewer_bits_make_collisions_on_purpose() {
        assert_eq!(hash("s", "k1", 1) >> 1, 0);
        assert_eq!(hash("s", "k1", 8), hash("s", "k1", 64) & 0xFF);
        // With one bit, of any three keys two share a lock.
        let h: Vec<u64> = ["a", "b", "c"].iter().map(|k| hash("s", k, 1)).collect();
        assert!(h[0] == h[1] || h[0] == h[2] || h[1] == h[2]);
    }
}
