package dev.pgidempotency;

import java.sql.SQLException;

/**
 * A database error with one of the SQLSTATEs the extension documents, as its own class
 * ({@link #of}); any other {@link SQLException} is thrown unchanged. The original error is the cause.
 */
public class IdempotencyException extends SQLException {
    private static final long serialVersionUID = 1L;

    IdempotencyException(String message, String sqlState, Throwable cause) {
        super(message, sqlState, cause);
    }

    /** 22004: an argument is NULL where a value is required. */
    public static final class NullArgument extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        NullArgument(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** 22023: a bad argument value (empty or too long key, bad ttl, status outside 100-599...). */
    public static final class InvalidArgument extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        InvalidArgument(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** IK001: no live record for (scope, key): never claimed, released, or expired. */
    public static final class NoLiveRecord extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        NoLiveRecord(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** IK002: the token no longer owns the record (taken over or released): do not report success. */
    public static final class ClaimTakenOver extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        ClaimTakenOver(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** IK003: the record is already completed by this token. */
    public static final class AlreadyCompleted extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        AlreadyCompleted(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** 54000: a response or checkpoint larger than idempotency.max_response_size. */
    public static final class ResponseTooLarge extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        ResponseTooLarge(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** 25006: a write function on a hot standby. */
    public static final class ReadOnly extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        ReadOnly(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** 40001: serialization failure; retry the transaction. */
    public static final class Serialization extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        Serialization(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** 55P03: lock_timeout while waiting behind another transaction's claim of the same key. */
    public static final class LockTimeout extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        LockTimeout(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /**
     * IK004: {@code idem_send} of an operation already recorded with another request, target or
     * key (an operation is sent once; a new request needs a new operation id).
     */
    public static final class OperationReused extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        OperationReused(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** 42501: the role lacks the grants, or row-level security refused the scope. */
    public static final class PermissionDenied extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        PermissionDenied(String m, String s, Throwable c) {
            super(m, s, c);
        }
    }

    /** The installed extension lacks a function this call needs (no SQLSTATE). */
    public static final class UnsupportedFeature extends IdempotencyException {
        private static final long serialVersionUID = 1L;

        UnsupportedFeature(String m) {
            super(m, null, null);
        }
    }

    /** The typed exception for {@code e}'s SQLSTATE, or {@code e} itself when it is not one of ours. */
    public static SQLException of(SQLException e) {
        if (e instanceof IdempotencyException || e.getSQLState() == null) {
            return e;
        }
        String m = e.getMessage();
        String s = e.getSQLState();
        return switch (s) {
            case "22004" -> new NullArgument(m, s, e);
            case "22023" -> new InvalidArgument(m, s, e);
            case "IK001" -> new NoLiveRecord(m, s, e);
            case "IK002" -> new ClaimTakenOver(m, s, e);
            case "IK003" -> new AlreadyCompleted(m, s, e);
            case "IK004" -> new OperationReused(m, s, e);
            case "54000" -> new ResponseTooLarge(m, s, e);
            case "25006" -> new ReadOnly(m, s, e);
            case "40001" -> new Serialization(m, s, e);
            case "55P03" -> new LockTimeout(m, s, e);
            case "42501" -> new PermissionDenied(m, s, e);
            default -> e;
        };
    }
}
