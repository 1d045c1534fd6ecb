//! A small connection pool: at most `size` connections, opened on demand, kept when idle.
//! (A real service would use deadpool-postgres or bb8; this keeps the example's
//! dependency list short.)

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, Config, NoTls};

pub struct Pool {
    config: Config,
    idle: Mutex<Vec<Client>>,
    permits: Arc<Semaphore>,
}

pub struct Conn {
    client: Option<Client>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    pub fn new(config: Config, size: usize) -> Arc<Pool> {
        Arc::new(Pool {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size)),
        })
    }

    pub async fn get(self: &Arc<Self>) -> Result<Conn, tokio_postgres::Error> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("pool semaphore is never closed");
        loop {
            let idle = self.idle.lock().unwrap().pop();
            match idle {
                Some(client) if !client.is_closed() => {
                    return Ok(Conn {
                        client: Some(client),
                        pool: self.clone(),
                        _permit: permit,
                    })
                }
                Some(_) => continue, // the server closed it: drop it, try the next one
                None => break,
            }
        }
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("charges-api: database connection closed: {e}");
            }
        });
        // A duplicate in same-transaction mode waits on the first one's claim; answer 409
        // rather than wait for ever behind a stuck transaction.
        client.batch_execute("SET lock_timeout = '5s'").await?;
        Ok(Conn {
            client: Some(client),
            pool: self.clone(),
            _permit: permit,
        })
    }
}

impl Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().unwrap()
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().unwrap()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // A Transaction dropped without commit has already queued its ROLLBACK on the
        // connection, so the next user starts outside any transaction.
        if let Some(client) = self.client.take() {
            if !client.is_closed() {
                self.pool.idle.lock().unwrap().push(client);
            }
        }
    }
}
