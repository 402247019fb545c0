//! The server's state: each client's session, prepared statements and running queries.
//!
//! A client that keeps cookies (the JDBC driver; ADBC with its cookie middleware) keeps one
//! session: the server names it in a `quarry_session` cookie the first time it answers. A
//! client that does not gets a fresh session for each statement, named in the statement's
//! ticket or handle so that the calls of one statement share it. Sessions share the nodes, the
//! planner and the one memory pool of the process ([`QuarrySession::fork`]); their settings
//! and views are their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use quarry_engine::{QuarrySession, QueryStop};
use tokio::task::AbortHandle;

/// The cookie naming a client's session.
pub const SESSION_COOKIE: &str = "quarry_session";
/// A session, prepared statement or plan unused this long is dropped.
pub const IDLE_LIMIT: Duration = Duration::from_secs(30 * 60);
/// Most sessions (and, separately, prepared statements) held at once; past it the least
/// recently used goes.
pub const MAX_HELD: usize = 1024;

/// A prepared statement: its session, its plan with placeholders, and the parameters bound.
pub struct Prepared {
    pub session: Arc<QuarrySession>,
    pub plan: LogicalPlan,
    pub params: Option<ParamValues>,
}

/// What the server holds between calls.
pub struct ServerState {
    base: QuarrySession,
    sessions: Mutex<HashMap<String, (Arc<QuarrySession>, Instant)>>,
    prepared: Mutex<HashMap<u64, (Arc<Mutex<Prepared>>, Instant)>>,
    /// The queries running now, by their ticket's query id.
    running: Mutex<HashMap<u64, Running>>,
}

impl ServerState {
    /// State over `base`, the session every other one is forked from.
    pub fn new(base: QuarrySession) -> Self {
        ServerState { base, sessions: Mutex::default(), prepared: Mutex::default(), running: Mutex::default() }
    }

    /// The session named `id`; made (under that name) if it is not held, e.g. after a restart.
    pub async fn session(&self, id: &str) -> datafusion::error::Result<Arc<QuarrySession>> {
        let held = self.sessions.lock().expect("sessions lock").get_mut(id).map(|(session, used)| {
            *used = Instant::now();
            Arc::clone(session)
        });
        if let Some(session) = held {
            // Tables loaded since the session began become visible.
            session.refresh_tables().await?;
            return Ok(session);
        }
        let session = Arc::new(self.base.fork().await?);
        let mut sessions = self.sessions.lock().expect("sessions lock");
        evict(&mut sessions);
        Ok(Arc::clone(&sessions.entry(id.to_string()).or_insert((session, Instant::now())).0))
    }

    /// A new session name.
    pub fn new_session_id() -> String {
        format!("{:032x}", rand::random::<u128>())
    }

    /// Holds `prepared` under a new handle.
    pub fn prepare(&self, prepared: Prepared) -> u64 {
        let handle = rand::random::<u64>();
        let mut held = self.prepared.lock().expect("prepared lock");
        evict(&mut held);
        held.insert(handle, (Arc::new(Mutex::new(prepared)), Instant::now()));
        handle
    }

    /// The prepared statement `handle`.
    pub fn prepared(&self, handle: u64) -> Option<Arc<Mutex<Prepared>>> {
        let mut held = self.prepared.lock().expect("prepared lock");
        let (prepared, used) = held.get_mut(&handle)?;
        *used = Instant::now();
        Some(Arc::clone(prepared))
    }

    /// Forgets the prepared statement `handle`; whether it was held.
    pub fn close(&self, handle: u64) -> bool {
        self.prepared.lock().expect("prepared lock").remove(&handle).is_some()
    }

    /// Records the running query `id`: a cancellation aborts its task and sets its `stop`
    /// (which the response stream waits on, and long-running operators check).
    pub fn started(&self, id: u64, running: Running) {
        self.running.lock().expect("running lock").insert(id, running);
    }

    /// The query `id` ended.
    pub fn ended(&self, id: u64) {
        self.running.lock().expect("running lock").remove(&id);
    }

    /// Stops the query `id`; whether it was running.
    pub fn cancel(&self, id: u64) -> bool {
        match self.running.lock().expect("running lock").remove(&id) {
            Some(running) => {
                running.stop();
                true
            }
            None => false,
        }
    }

    /// A session for one statement of a client without a session of its own.
    pub async fn fresh(&self) -> datafusion::error::Result<Arc<QuarrySession>> {
        Ok(Arc::new(self.base.fork().await?))
    }
}

/// A running query's handles: its task, and the stop its response stream and long-running
/// operators watch.
#[derive(Clone)]
pub struct Running {
    pub task: AbortHandle,
    pub stop: Arc<QueryStop>,
}

impl Running {
    /// Aborts the task (it ends at its next yield) and sets the stop.
    pub fn stop(&self) {
        self.task.abort();
        self.stop.stop();
    }
}

/// Drops what has been idle too long, and the least recently used beyond [`MAX_HELD`] - 1.
fn evict<K: Clone + Eq + std::hash::Hash, V>(held: &mut HashMap<K, (V, Instant)>) {
    held.retain(|_, (_, used)| used.elapsed() < IDLE_LIMIT);
    while held.len() >= MAX_HELD {
        let oldest = held.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()).expect("not empty");
        held.remove(&oldest);
    }
}
