//! C symbols that only the SQL of older releases calls. The library is not versioned: a
//! database keeps its release's SQL until `ALTER EXTENSION idempotency UPDATE`, and that SQL
//! names its functions' C symbols (`AS 'MODULE_PATHNAME', 'SYMBOL'`), so every symbol that a
//! frozen install script (a past release's, in git history: sql/releases/past.tsv; the
//! current one's in sql/releases/) or an upgrade script (sql/*--*.sql) names must stay in the
//! library. Those that today's install script no longer names live here, each with
//! the releases that need it, and none of them is in the install script (`sql = false`).
//! The tests below read the scripts and hold this list to them; the upgrade suite installs
//! every frozen release into a server running this library.

use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::api::claim;
use crate::errors::OrRaise;

/// `idem_claim_wrapper`: the five-argument idem_claim of releases 0.1.0, 0.2.0 and 0.3.0
/// (0.4.0 added `wait` and `token` under the new symbol idem_claim_wait_token_wrapper).
#[pg_extern(sql = false)]
fn idem_claim(
    fcinfo: pg_sys::FunctionCallInfo,
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: Option<&str>,
    ttl: Option<Interval>,
    lease: Option<Interval>,
) -> pgrx::composite_type!('static, "idempotency.claim_result") {
    claim::claim(scope, key, fingerprint, ttl, lease, None, None, Some(false)).or_raise().into_tuple(fcinfo)
}

/// `idem_claim_wait_token_wrapper`: the seven-argument idem_claim of releases 0.4.0, 0.4.1
/// and 0.5.0 (`deferred`, new in 0.6.0, under the new symbol idem_claim_deferred_wrapper).
#[allow(clippy::too_many_arguments)]
#[pg_extern(sql = false)]
fn idem_claim_wait_token(
    fcinfo: pg_sys::FunctionCallInfo,
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: Option<&str>,
    ttl: Option<Interval>,
    lease: Option<Interval>,
    wait: Option<Interval>,
    token: Option<pgrx::datum::Uuid>,
) -> pgrx::composite_type!('static, "idempotency.claim_result") {
    claim::claim(scope, key, fingerprint, ttl, lease, wait, token, Some(false)).or_raise().into_tuple(fcinfo)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::fs;
    use std::path::Path;
    use std::process::Command;

    /// The symbols kept here, each with the releases whose install script names it.
    const KEPT: &[(&str, &[&str])] = &[
        ("idem_claim_wrapper", &["0.1.0", "0.2.0", "0.3.0"]),
        ("idem_claim_wait_token_wrapper", &["0.4.0", "0.4.1", "0.5.0"]),
    ];

    /// The C symbols an SQL script names.
    fn symbols(text: &str) -> BTreeSet<String> {
        const MARK: &str = "AS 'MODULE_PATHNAME', '";
        text.match_indices(MARK)
            .map(|(at, _)| {
                let rest = &text[at + MARK.len()..];
                rest[..rest.find('\'').expect("a closing quote")].to_string()
            })
            .collect()
    }

    /// Every script in `dir` whose file name starts "idempotency--" and ends ".sql".
    fn scripts(dir: &str) -> Vec<std::path::PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut found: Vec<_> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with("idempotency--") && name.ends_with(".sql")
            })
            .collect();
        found.sort();
        found
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The release an install script installs: "idempotency--0.3.0.sql" -> "0.3.0".
    fn release(path: &Path) -> String {
        let name = path.file_name().unwrap().to_string_lossy();
        name["idempotency--".len()..name.len() - ".sql".len()].to_string()
    }

    /// What `scripts/past-releases.sh ARGS` prints (the past releases, out of git history).
    fn past_releases(args: &[&str]) -> String {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/past-releases.sh");
        let out = Command::new("bash").arg(&script).args(args).output().expect("bash runs");
        assert!(
            out.status.success(),
            "{} {}: {}",
            script.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    }

    /// Every release's native install script by version: the past ones out of git history, the
    /// current one from sql/releases/ once it is frozen.
    fn release_scripts() -> BTreeMap<String, String> {
        let mut found: BTreeMap<String, String> = past_releases(&["list", "native"])
            .lines()
            .map(|v| (v.to_string(), past_releases(&["show", v, "native"])))
            .collect();
        found.extend(scripts("sql/releases").iter().map(|p| (release(p), read(p))));
        found
    }

    fn newest(releases: &BTreeMap<String, BTreeSet<String>>) -> &String {
        let parts = |v: &String| v.split('.').map(|n| n.parse::<u32>().unwrap()).collect::<Vec<_>>();
        releases.keys().max_by_key(|v| parts(v)).expect("at least one release")
    }

    #[test]
    #[cfg_attr(
        no_release_history,
        ignore = "no git history of the past releases here (a shallow clone or a tarball; build.rs)"
    )]
    fn kept_symbols_are_exactly_those_only_older_releases_name() {
        let releases: BTreeMap<String, BTreeSet<String>> =
            release_scripts().iter().map(|(v, text)| (v.clone(), symbols(text))).collect();
        let newest = newest(&releases).clone();
        let current = &releases[&newest];

        // What the older releases need that the newest no longer names, release by release.
        let mut only_old: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (version, names) in &releases {
            for name in names.difference(current) {
                only_old.entry(name.clone()).or_default().push(version.clone());
            }
        }
        let kept: BTreeMap<String, Vec<String>> = KEPT
            .iter()
            .map(|(name, versions)| (name.to_string(), versions.iter().map(|v| v.to_string()).collect()))
            .collect();
        assert_eq!(kept, only_old, "the symbols kept for older releases (newest: {newest})");
        // An upgrade script names only symbols that are in the newest release or kept here.
        let known: BTreeSet<&String> = current.iter().chain(kept.keys()).collect();
        for script in scripts("sql") {
            for name in symbols(&read(&script)) {
                assert!(known.contains(&name), "{}: {name} is neither current nor kept", script.display());
            }
        }
    }

    #[test]
    fn every_kept_symbol_is_a_pg_extern_of_this_file() {
        // pgrx names the C symbol of `fn NAME` "NAME_wrapper".
        let source = include_str!("compat.rs");
        for (symbol, _) in KEPT {
            let function = symbol.strip_suffix("_wrapper").expect("a pgrx wrapper's name");
            assert!(
                source.contains(&format!("#[pg_extern(sql = false)]\nfn {function}(")),
                "{symbol}: no #[pg_extern(sql = false)] fn {function} here"
            );
        }
    }
}
