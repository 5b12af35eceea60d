//! `lagscope migrate status|apply` as an operator runs it, on both backends.

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;

use std::process::Command;

/// Runs `lagscope migrate ARGS`; returns (success, stdout, stderr).
fn migrate(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope")).arg("migrate").args(args).output().expect("runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn states(stdout: &str) -> Vec<&str> {
    stdout.lines().map(|line| line.rsplit("  ").next().unwrap_or_default()).collect()
}

fn status_then_apply(location: &[&str], expected: usize) {
    let (ok, stdout, stderr) = migrate(&[&["status"], location].concat());
    assert!(ok, "{stderr}");
    assert_eq!(states(&stdout), vec!["pending"; expected], "{stdout}");
    assert!(stderr.contains(&format!("0 applied, {expected} pending")), "{stderr}");

    let (ok, stdout, stderr) = migrate(&[&["apply"], location].concat());
    assert!(ok, "{stderr}");
    assert_eq!(states(&stdout), vec!["applied"; expected], "{stdout}");

    let (ok, stdout, _) = migrate(&[&["status"], location].concat());
    assert!(ok);
    assert_eq!(states(&stdout), vec!["applied"; expected], "{stdout}");
}

#[test]
fn sqlite_migrations_are_listed_then_applied() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data_dir = directory.path().join("data");
    let expected =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/sqlite")).expect("dir").count();
    status_then_apply(&["--data-dir", &data_dir.to_string_lossy()], expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_are_listed_then_applied() {
    let url = postgres_support::fresh_database().await;
    let expected =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/postgres")).expect("dir").count();
    tokio::task::spawn_blocking(move || status_then_apply(&["--database-url", &url], expected)).await.expect("ran");
}

#[test]
fn an_unreachable_database_is_named_in_the_error() {
    let (ok, _, stderr) = migrate(&["status", "--database-url", "postgres://lagscope:secret@127.0.0.1:1/nothing"]);
    assert!(!ok);
    assert!(stderr.contains("127.0.0.1:1"), "{stderr}");
    assert!(!stderr.contains("secret"), "the password is not printed: {stderr}");
}
