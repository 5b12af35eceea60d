//! Progress of the long commands (`analyze`, `convert`, `sim`) on stderr: how far through
//! which file (or how much of the run simulated), how much was read and found, and the rate.
//! Redrawn in place on a terminal, as lines when asked for (logs), nothing otherwise (scripts
//! read that stderr).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

/// The `--progress-every` option of the long commands.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct ProgressArgs {
    /// Print a progress line to stderr every this many seconds (how far, spans, anomalies
    /// where looked for, rate) [default: once a second, redrawn in place, when stderr is a
    /// terminal; none otherwise].
    #[arg(long, value_name = "SECONDS")]
    pub progress_every: Option<f64>,
}

impl ProgressArgs {
    /// The progress these arguments ask for, on this process's stderr.
    pub fn progress(self) -> anyhow::Result<Progress> {
        Progress::choose(self.progress_every, std::io::IsTerminal::is_terminal(&std::io::stderr()))
    }
}

/// How a long command reports its progress on stderr while it reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Progress {
    Off,
    /// A line every so often, each on a line of its own (for logs).
    Lines(Duration),
    /// One line redrawn in place every so often, and erased at the end (for a terminal).
    InPlace(Duration),
}

impl Progress {
    /// `every` seconds on lines of their own when asked for; otherwise once a second in place
    /// when stderr is a terminal, and none when it is not (a log or a script reading it).
    pub fn choose(every: Option<f64>, stderr_is_terminal: bool) -> anyhow::Result<Self> {
        match every {
            Some(seconds) => match Duration::try_from_secs_f64(seconds) {
                Ok(every) => Ok(Self::Lines(every)),
                Err(_) => bail!("--progress-every {seconds}: not a number of seconds (0 or more)"),
            },
            None if stderr_is_terminal => Ok(Self::InPlace(Duration::from_secs(1))),
            None => Ok(Self::Off),
        }
    }
}

/// How far a command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// Bytes read of the current file.
    Bytes(u64),
    /// Simulated time since the run's start, of the run's length when known (nanoseconds).
    Simulated { at: i64, of: Option<i64> },
    /// Read from a store up to `at`, of the data from `first` to `last` (nanoseconds since the
    /// Unix epoch).
    Stored { at: i64, first: i64, last: i64 },
    /// `at` of `of` windows of time whose spans are joined into timelines (`export`).
    Joined { at: i64, of: i64 },
}

/// Progress through the capture files (or a simulated run): where in which file, spans pushed, anomalies found,
/// and the rate since the start.
pub(crate) struct Reporter {
    /// The command, first on each line.
    command: &'static str,
    progress: Progress,
    started: Instant,
    next: Option<Instant>,
    files: usize,
    file_index: usize,
    file_name: String,
    /// The file's name without its directory.
    short_name: String,
    /// The current file's size, when known.
    file_bytes: Option<u64>,
    /// Whether a line drawn in place is on screen.
    drawn: bool,
}

impl Reporter {
    pub(crate) fn new(command: &'static str, progress: Progress, files: usize) -> Self {
        let started = Instant::now();
        let next = match progress {
            Progress::Off => None,
            Progress::Lines(every) | Progress::InPlace(every) => Some(started + every),
        };
        Self {
            command,
            progress,
            started,
            next,
            files,
            file_index: 0,
            file_name: String::new(),
            short_name: String::new(),
            file_bytes: None,
            drawn: false,
        }
    }

    /// A file is about to be read.
    pub(crate) fn file(&mut self, path: &Path) {
        self.file_index += 1;
        self.file_name = path.display().to_string();
        self.short_name =
            path.file_name().map_or_else(|| self.file_name.clone(), |name| name.to_string_lossy().into_owned());
        self.file_bytes = std::fs::metadata(path).ok().map(|metadata| metadata.len());
    }

    /// Whether it reports at all (with [`Progress::Off`] it never does).
    pub(crate) fn active(&self) -> bool {
        self.next.is_some()
    }

    /// Whether a report is due at `now` (cheap: called for every chunk read).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|next| now >= next)
    }

    /// Reports `bytes_done` of the current file read, `spans` handled, and `anomalies` found
    /// (for a command that looks for them).
    pub(crate) fn report(&mut self, now: Instant, bytes_done: u64, spans: u64, anomalies: Option<usize>) {
        self.report_at(now, Position::Bytes(bytes_done), spans, anomalies);
    }

    /// [`Reporter::report`] at any [`Position`].
    pub(crate) fn report_at(&mut self, now: Instant, position: Position, spans: u64, anomalies: Option<usize>) {
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let rate = spans as f64 / elapsed.max(1e-9);
        let through = match (position, self.file_bytes) {
            (Position::Bytes(done), Some(total)) if total > 0 => {
                format!("{:.0}% of {}", (done.min(total) as f64 * 100.0 / total as f64).floor(), human_bytes(total))
            }
            (Position::Bytes(done), _) => format!("{} read", human_bytes(done)),
            (Position::Simulated { at, of: Some(of) }, _) if of > 0 => format!(
                "{:.0}% of {} s simulated",
                (at.clamp(0, of) as f64 * 100.0 / of as f64).floor(),
                of / 1_000_000_000
            ),
            (Position::Simulated { at, .. }, _) => format!("{} s simulated", at.max(0) / 1_000_000_000),
            (Position::Joined { at, of }, _) => {
                format!("{:.0}% of the spans joined", (at.clamp(0, of) as f64 * 100.0 / of.max(1) as f64).floor())
            }
            (Position::Stored { at, first, last }, _) => {
                let of = last.saturating_sub(first).max(1);
                format!(
                    "{:.0}% of {} s stored",
                    (at.saturating_sub(first).clamp(0, of) as f64 * 100.0 / of as f64).floor(),
                    of / 1_000_000_000
                )
            }
        };
        let files =
            if self.files > 1 { format!(" (file {} of {})", self.file_index, self.files) } else { String::new() };
        let found = |count: String| anomalies.map(|_| format!(", {count} anomalies")).unwrap_or_default();
        let mut stderr = std::io::stderr().lock();
        // Progress is best effort: a closed stderr does not stop the work.
        let _ = match self.progress {
            Progress::Off => return,
            Progress::Lines(every) => {
                self.next = Some(now + every);
                let found = found(anomalies.unwrap_or_default().to_string());
                let file =
                    if self.file_name.is_empty() { String::new() } else { format!("{}{files}: ", self.file_name) };
                writeln!(
                    stderr,
                    "{}: {file}{through}; {spans} spans{found} so far; {elapsed:.0} s, {rate:.0} spans/s",
                    self.command
                )
            }
            Progress::InPlace(every) => {
                self.next = Some(now + every);
                self.drawn = true;
                // A line that wraps cannot be redrawn with a carriage return: at most 79
                // characters, the numbers first and the file's name (without its directory)
                // last, where it may be cut.
                let mut line = format!(
                    "{through}{files}: {} spans{}, {} spans/s",
                    human_count(spans as f64),
                    found(human_count(anomalies.unwrap_or_default() as f64)),
                    human_count(rate),
                );
                if !self.short_name.is_empty() {
                    line = format!("{line}; {}", self.short_name);
                }
                let line: String = line.chars().take(79).collect();
                write!(stderr, "\r\x1b[K{line}").and_then(|()| stderr.flush())
            }
        };
    }
}

impl Drop for Reporter {
    /// Erases a line drawn in place: the command's summary, or its error, comes next.
    fn drop(&mut self) {
        if self.drawn {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[K").and_then(|()| stderr.flush());
        }
    }
}

/// A count in three significant figures with a decimal suffix (`1.96 M`), exact below 1 000.
fn human_count(value: f64) -> String {
    let (scaled, suffix) = match value {
        value if value < 1e3 => return format!("{value:.0}"),
        value if value < 1e6 => (value / 1e3, "k"),
        value if value < 1e9 => (value / 1e6, "M"),
        value => (value / 1e9, "G"),
    };
    let decimals = if scaled < 10.0 {
        2
    } else if scaled < 100.0 {
        1
    } else {
        0
    };
    format!("{scaled:.decimals$} {suffix}")
}

/// Bytes in the largest unit that keeps a number of at least 1 (decimal units, as `du -h --si`).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let (mut value, mut unit) = (bytes as f64, 0);
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_numbers_read_at_a_glance() {
        let counts = [0.0, 999.0, 1_000.0, 76_901.0, 196_486.0, 1_964_855.0, 12_345_678.0, 2.5e9];
        let shown: Vec<String> = counts.into_iter().map(human_count).collect();
        assert_eq!(shown, ["0", "999", "1.00 k", "76.9 k", "196 k", "1.96 M", "12.3 M", "2.50 G"]);
        let sizes = [0, 999, 139_500, 688_739_115, 1_100_000_000_000];
        let shown: Vec<String> = sizes.into_iter().map(human_bytes).collect();
        assert_eq!(shown, ["0 B", "999 B", "139.5 kB", "688.7 MB", "1.1 TB"]);
    }

    #[test]
    fn progress_is_asked_for_or_follows_the_terminal() {
        assert_eq!(Progress::choose(Some(2.5), false).expect("valid"), Progress::Lines(Duration::from_millis(2_500)));
        assert_eq!(Progress::choose(Some(0.0), true).expect("valid"), Progress::Lines(Duration::ZERO));
        assert_eq!(Progress::choose(None, true).expect("valid"), Progress::InPlace(Duration::from_secs(1)));
        assert_eq!(Progress::choose(None, false).expect("valid"), Progress::Off);
        for refused in [-1.0, f64::NAN, f64::INFINITY] {
            let error = Progress::choose(Some(refused), false).expect_err("refused").to_string();
            assert!(error.contains("--progress-every"), "{error}");
        }
    }
}
