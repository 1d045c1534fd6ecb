//! Where the extension's tables live: plain tables on one server, or tables that Citus
//! distributes by scope (sql/citus.sql's `distribute()`). The statements that must differ
//! between the two come in one form for each (`PerDeployment`); `tables` says which to run.

use pgrx::spi::SpiClient;

use crate::spi::{self, get, Kind, Statement};

/// Where a table lives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// A plain table on one server.
    OneServer,
    /// A Citus distributed table.
    Citus,
}

/// A statement in the form each deployment needs.
pub struct PerDeployment {
    pub one_server: Statement,
    pub citus: Statement,
}

impl PerDeployment {
    pub fn on(&'static self, deployment: Deployment) -> &'static Statement {
        match deployment {
            Deployment::OneServer => &self.one_server,
            Deployment::Citus => &self.citus,
        }
    }
}

/// Where idempotency.keys and idempotency.messages live.
pub struct Tables {
    pub keys: Deployment,
    pub messages: Deployment,
}

static CITUS_INSTALLED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension \
                         WHERE extname OPERATOR(pg_catalog.=) 'citus') AS installed",
    args: &[],
    kind: Kind::Read,
    columns: &["installed"],
};

// Names a Citus catalog: prepared and run only where Citus is installed.
static DISTRIBUTED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition \
                         WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass) AS keys, \
                 EXISTS (SELECT FROM pg_catalog.pg_dist_partition \
                         WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.messages'::pg_catalog.regclass) AS messages",
    args: &[],
    kind: Kind::Read,
    columns: &["keys", "messages"],
};

/// Where the tables live now (asked on every call: `distribute()` may have run since).
pub fn tables(client: &mut SpiClient<'_>) -> Tables {
    let citus: bool =
        get(&spi::run(client, &CITUS_INSTALLED, &[]).first(), &CITUS_INSTALLED, "installed").unwrap_or(false);
    if !citus {
        return Tables { keys: Deployment::OneServer, messages: Deployment::OneServer };
    }
    let row = spi::run(client, &DISTRIBUTED, &[]).first();
    let on = |distributed: Option<bool>| {
        if distributed.unwrap_or(false) {
            Deployment::Citus
        } else {
            Deployment::OneServer
        }
    };
    Tables { keys: on(get(&row, &DISTRIBUTED, "keys")), messages: on(get(&row, &DISTRIBUTED, "messages")) }
}
