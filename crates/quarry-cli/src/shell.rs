//! `quarry shell`: interactive SQL with history and multi-line statements.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use quarry_engine::{OutputFormat, user_message};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use tokio::sync::Notify;

use crate::CliResult;
use crate::sql::run_statement;
use crate::target::Target;

const HELP: &str = "Statements end with ';' and may span lines.
  .tables           list tables
  .schema TABLE     show a table's columns
  .help             this text
  .quit             leave (or Ctrl-D)
Ctrl-C stops a running statement.";

fn history_path() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".quarry_history"))
}

pub async fn run(target: &Target) -> CliResult {
    let session = target.session().await?;
    let interrupts = interrupts();
    let mut editor = DefaultEditor::new().map_err(|e| format!("starting the line editor: {e}"))?;
    let history = history_path();
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    println!("Quarry {} — {}. Type .help for help.", env!("CARGO_PKG_VERSION"), where_from(target));
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() { "quarry> " } else { "   ...> " };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(format!("reading input: {e}")),
        };
        let trimmed = line.trim();
        if buffer.is_empty() && trimmed.starts_with('.') {
            let _ = editor.add_history_entry(trimmed);
            let mut words = trimmed.split_whitespace();
            match (words.next(), words.next()) {
                (Some(".quit" | ".exit"), _) => break,
                (Some(".help"), _) => println!("{HELP}"),
                (Some(".tables"), _) => run_sql(&session, "SHOW TABLES", &interrupts).await,
                (Some(".schema"), Some(table)) => run_sql(&session, &format!("DESCRIBE {table}"), &interrupts).await,
                _ => println!("unknown command '{trimmed}'; .help lists the commands"),
            }
            continue;
        }
        if trimmed.is_empty() && buffer.is_empty() {
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if trimmed.ends_with(';') {
            let sql = std::mem::take(&mut buffer);
            let _ = editor.add_history_entry(sql.trim());
            run_sql(&session, &sql, &interrupts).await;
        }
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    Ok(())
}

/// Runs the statements of `sql`, printing results, the time, or the error; never exits.
async fn run_sql(session: &quarry_engine::QuarrySession, sql: &str, interrupts: &Notify) {
    if let Err(e) = session.refresh_tables().await {
        eprintln!("error: {}", user_message(&e));
        return;
    }
    let statements = match session.parse(sql) {
        Ok(statements) => statements,
        Err(e) => {
            eprintln!("error: {}", user_message(&e));
            return;
        }
    };
    for statement in statements {
        let started = Instant::now();
        // Ctrl-C stops the running statement, not the shell (at the prompt the line editor
        // takes it as a key). Dropping the statement's future aborts the query's tasks, which
        // stop at their next yield.
        let outcome = tokio::select! {
            outcome = run_statement(session, statement, OutputFormat::Table, None) => outcome,
            () = interrupts.notified() => Err("interrupted (Ctrl-C): the statement was stopped".to_string()),
        };
        match outcome {
            Ok(stats) => println!(
                "{} rows in {:.3}s ({:.1} MB read from storage{})",
                stats.rows_returned,
                started.elapsed().as_secs_f64(),
                stats.bytes_read_storage as f64 / 1e6,
                stats.energy.as_ref().map_or(String::new(), |e| format!("; {}", e.summary()))
            ),
            Err(message) => {
                eprintln!("error: {message}");
                return;
            }
        }
    }
}

/// Wakes its waiters at each Ctrl-C, seen from a thread of its own: the query runtime's workers,
/// busy with a long join, poll tokio's signal driver only every 61 tasks. Nobody waits at the
/// prompt, so a Ctrl-C there is not kept for the next statement.
fn interrupts() -> Arc<Notify> {
    let interrupts = Arc::new(Notify::new());
    let notify = Arc::clone(&interrupts);
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        runtime.block_on(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                notify.notify_waiters();
            }
        });
    });
    interrupts
}

fn where_from(target: &Target) -> String {
    if target.is_remote() { format!("storage nodes {}", target.nodes.join(", ")) } else { format!("warehouse {}", target.warehouse.display()) }
}
