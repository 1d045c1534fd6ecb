//! `Jsonb`: a jsonb value passed through as PostgreSQL's own datum.
//!
//! pgrx's `JsonB` parses every value into serde_json and back. Response bodies can be
//! megabytes and we never look inside them, so arguments stay the caller's datum and go
//! straight into the statement that stores them; values read back are copied once.

use std::ffi::CStr;

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::{direct_function_call, FromDatum, IntoDatum};

use crate::jcs::{self, CanonError, Writer};

#[derive(Debug, Clone, Copy)]
pub struct Jsonb(pg_sys::Datum);

impl Jsonb {
    /// The root container's kind: "object", "array" or "scalar".
    pub fn kind(&self) -> &'static str {
        // SAFETY: the datum is a valid jsonb varlena; JsonbContainer.header is the first
        // word after the varlena header.
        unsafe {
            let detoasted = pg_sys::pg_detoast_datum(self.0.cast_mut_ptr());
            let header = *(pgrx::vardata_any(detoasted.cast()) as *const u32);
            if header & pg_sys::JB_FSCALAR != 0 {
                "scalar"
            } else if header & pg_sys::JB_FOBJECT != 0 {
                "object"
            } else {
                "array"
            }
        }
    }

    /// jsonb_typeof's answer: "object", "array", "string", "number", "boolean" or "null".
    pub fn type_name(&self) -> String {
        // SAFETY: jsonb_typeof takes a jsonb datum and returns text.
        unsafe { direct_function_call::<String>(pg_sys::jsonb_typeof, &[Some(self.0)]) }
            .expect("jsonb_typeof returned NULL")
    }

    /// The value's size in bytes as stored uncompressed, read from its header (no detoasting).
    pub fn raw_size(&self) -> usize {
        // SAFETY: the datum is a valid jsonb varlena.
        unsafe { pg_sys::toast_raw_datum_size(self.0) }
    }

    /// idem_fingerprint of the value: the sha256 of its RFC 8785 canonical text, leaving out
    /// the top-level keys in `ignore`, written from the value's binary form straight into the
    /// hasher (`jcs::write_jsonb`).
    ///
    /// In a database whose encoding is not UTF-8 the strings are not UTF-8, so the value
    /// goes through its text form and the text parser instead (`jcs::fingerprint_json`).
    pub fn fingerprint(&self, ignore: &[&str]) -> Result<String, CanonError> {
        // SAFETY: plain function of the backend.
        if unsafe { pg_sys::GetDatabaseEncoding() } != pg_sys::pg_enc::PG_UTF8 as i32 {
            return jcs::fingerprint_json(&self.to_text(), ignore);
        }
        let mut w = Writer::hashing();
        // SAFETY: the datum is a valid jsonb varlena, detoasted into memory that lives until
        // the function returns; the root container is its data. Each numeric handed to
        // `number` is a numeric datum inside it.
        unsafe {
            let detoasted = pg_sys::pg_detoast_datum(self.0.cast_mut_ptr());
            let root = std::slice::from_raw_parts(
                pgrx::vardata_any(detoasted.cast()) as *const u8,
                pgrx::varsize_any_exhdr(detoasted.cast()),
            );
            jcs::write_jsonb(root, ignore, &mut w, |numeric, w| {
                // Plain decimal text without trailing zeros ("1234.5", "0.001"), no exponent.
                let text = pg_sys::numeric_normalize(numeric.as_ptr() as pg_sys::Numeric);
                let result = w.number(CStr::from_ptr(text).to_str().unwrap_or("NaN"));
                pg_sys::pfree(text.cast());
                result
            })?;
        }
        Ok(w.fingerprint())
    }

    /// A copy that lives until the transaction ends: for a value kept between statements.
    pub fn copy_for_transaction(self) -> Jsonb {
        // SAFETY: the datum is a valid jsonb varlena; the copy is made in TopTransactionContext,
        // which lives until the transaction ends, and the previous context is restored.
        unsafe {
            let previous = pg_sys::MemoryContextSwitchTo(pg_sys::TopTransactionContext);
            let copy = pg_sys::pg_detoast_datum_copy(self.0.cast_mut_ptr());
            pg_sys::MemoryContextSwitchTo(previous);
            Jsonb(pg_sys::Datum::from(copy))
        }
    }

    /// PostgreSQL's text form of the value (jsonb_out).
    pub fn to_text(self) -> String {
        // SAFETY: jsonb_out takes a jsonb datum and returns a palloc'd C string.
        unsafe {
            let text = direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(self.0)])
                .expect("jsonb_out returned NULL");
            let owned = text.to_string_lossy().into_owned();
            pg_sys::pfree(text.as_ptr() as *mut _);
            owned
        }
    }
}

impl FromDatum for Jsonb {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            None
        } else {
            // Values read through SPI must outlive SPI_finish: copy (and detoast) them into the
            // memory context pgrx switched to.
            Some(Jsonb(pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(datum.cast_mut_ptr()))))
        }
    }
}

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for Jsonb {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // An argument lives for the whole call: take the datum as it is, no copy.
        let datum = unsafe { arg.unbox_arg_using_from_datum::<pg_sys::Datum>() };
        Jsonb(datum.expect("jsonb argument must not be null"))
    }
}

unsafe impl BoxRet for Jsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        // SAFETY: the datum was copied into a memory context that outlives the call.
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

unsafe impl SqlTranslatable for Jsonb {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(Jsonb);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}
