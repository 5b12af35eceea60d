//! Output written on a thread of its own: `analyze --format jsonl` hands its anomalies' lines
//! over in chunks and goes on analysing while the chunks are written. On a busy disk a
//! `write` blocks while the kernel flushes dirty pages (the 10 M-span capture writes 1.1 GB:
//! BENCHMARKS.md measured 2-3 s of a 9 s run blocked there); on its own thread that wait
//! overlaps the analysis instead of adding to it. The writing thread only copies bytes into
//! the kernel: the lines are still serialized on the caller's thread.

use std::io::{self, Write};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, channel, sync_channel};
use std::thread::JoinHandle;

/// Writes the chunks handed to it, in order, on its own thread; at most `in_flight` chunks
/// wait (a caller faster than the sink then waits for it), and written chunks come back empty
/// to be filled again, so that no more than `in_flight + 2` buffers ever exist.
pub struct ChunkWriter {
    chunks: Option<SyncSender<Vec<u8>>>,
    emptied: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// The sink's error, once it failed: every later call reports it again.
    failed: Option<(io::ErrorKind, String)>,
}

impl ChunkWriter {
    /// Starts the thread that writes to `sink` (flushed when [`ChunkWriter::finish`] is called).
    pub fn spawn<W: Write + Send + 'static>(mut sink: W, in_flight: usize) -> io::Result<Self> {
        let (chunks, to_write) = sync_channel::<Vec<u8>>(in_flight.max(1));
        let (give_back, emptied) = channel();
        let thread = std::thread::Builder::new().name("output".to_string()).spawn(move || {
            for mut chunk in to_write {
                sink.write_all(&chunk)?;
                chunk.clear();
                // The caller may have finished (and stopped taking buffers back) meanwhile.
                let _ = give_back.send(chunk);
            }
            sink.flush()
        })?;
        Ok(Self { chunks: Some(chunks), emptied, thread: Some(thread), failed: None })
    }

    /// Hands `chunk` over to be written (waiting while `in_flight` chunks wait already) and
    /// returns an empty buffer to fill next: one written already, or a new one of the same
    /// capacity. After the sink failed, the sink's error.
    pub fn write(&mut self, chunk: Vec<u8>) -> io::Result<Vec<u8>> {
        let capacity = chunk.capacity();
        let sent = match &self.chunks {
            Some(chunks) => chunks.send(chunk).is_ok(),
            None => false,
        };
        if !sent {
            // The thread stopped (the sink failed), or the output was finished.
            self.join()?;
            return Err(io::Error::other("the output was finished"));
        }
        match self.emptied.try_recv() {
            Ok(buffer) => Ok(buffer),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => Ok(Vec::with_capacity(capacity)),
        }
    }

    /// Waits until every chunk handed over is written and the sink flushed.
    pub fn finish(mut self) -> io::Result<()> {
        self.join()
    }

    /// Stops the thread once what it was handed is written: the sink's error, if it failed
    /// (then and on every later call).
    fn join(&mut self) -> io::Result<()> {
        drop(self.chunks.take());
        if let Some(thread) = self.thread.take() {
            let result = thread.join().unwrap_or_else(|_| Err(io::Error::other("the output thread panicked")));
            if let Err(error) = result {
                self.failed = Some((error.kind(), error.to_string()));
            }
        }
        match &self.failed {
            Some((kind, message)) => Err(io::Error::new(*kind, message.clone())),
            None => Ok(()),
        }
    }
}

impl Drop for ChunkWriter {
    /// Finishes writing what was handed over (an error then goes unreported: call
    /// [`ChunkWriter::finish`] to see it).
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A sink that keeps what it is given, and fails once it holds `fail_after` bytes.
    #[derive(Clone)]
    struct Sink {
        written: Arc<Mutex<Vec<u8>>>,
        fail_after: usize,
        slow: bool,
    }

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if self.slow {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let mut written = self.written.lock().expect("sink lock");
            if written.len() + bytes.len() > self.fail_after {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the reader went away"));
            }
            written.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn chunk(number: usize) -> Vec<u8> {
        format!("{{\"chunk\":{number}}}\n").repeat(number % 7 + 1).into_bytes()
    }

    #[test]
    fn every_chunk_is_written_in_order_through_a_few_buffers() {
        for (in_flight, slow) in [(1, true), (2, false), (16, true)] {
            let sink = Sink { written: Arc::default(), fail_after: usize::MAX, slow };
            let mut writer = ChunkWriter::spawn(sink.clone(), in_flight).expect("spawn");
            let mut expected = Vec::new();
            let mut buffer = Vec::with_capacity(1 << 10);
            let mut buffers = std::collections::HashSet::new();
            for number in 0..200 {
                buffer.extend_from_slice(&chunk(number));
                expected.extend_from_slice(&chunk(number));
                buffers.insert(buffer.as_ptr() as usize);
                buffer = writer.write(buffer).expect("written");
                assert!(buffer.is_empty(), "a buffer comes back empty");
            }
            writer.finish().expect("finished");
            assert_eq!(*sink.written.lock().expect("lock"), expected, "in_flight {in_flight}");
            // Buffers are reused, not allocated per chunk (the allocator may hand a freed
            // block out again, which only lowers the count).
            assert!(buffers.len() <= in_flight + 2, "{} buffers for in_flight {in_flight}", buffers.len());
        }
    }

    #[test]
    fn the_sinks_error_reaches_the_caller_and_what_came_before_is_written() {
        let sink = Sink { written: Arc::default(), fail_after: 1_000, slow: false };
        let mut writer = ChunkWriter::spawn(sink.clone(), 2).expect("spawn");
        let mut error = None;
        for number in 0..1_000 {
            match writer.write(chunk(number)) {
                Ok(_) => {}
                Err(failed) => {
                    error = Some(failed);
                    break;
                }
            }
        }
        let error = error.expect("the sink's error is reported");
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe, "{error}");
        // And again to a caller that writes what it has left, then finishes.
        let again = writer.write(chunk(1)).expect_err("the sink failed");
        assert_eq!((again.kind(), again.to_string()), (error.kind(), error.to_string()));
        let at_finish = writer.finish().expect_err("the sink failed");
        assert_eq!((at_finish.kind(), at_finish.to_string()), (error.kind(), error.to_string()));
        let written = sink.written.lock().expect("lock");
        let expected: Vec<u8> = (0..)
            .map(chunk)
            .scan(0, |total, bytes| {
                *total += bytes.len();
                (*total <= 1_000).then_some(bytes)
            })
            .flatten()
            .collect();
        assert_eq!(*written, expected, "every chunk before the failing one, whole");
    }
}

/// A file written under a temporary name beside its destination and renamed over it only once
/// it is complete ([`Replacement::commit`]): a command that fails (an unknown scenario, a
/// broken input line, a full disk, Ctrl-C) leaves what was at the destination as it was, and
/// never a truncated file under the destination's name. Dropped uncommitted, the temporary
/// file is removed. A destination that exists and is not a regular file (`/dev/null`, a pipe,
/// a terminal, `/dev/stdout`) is written in place: renamed over, the device or pipe itself
/// would be replaced by a file.
#[derive(Debug)]
pub struct Replacement {
    /// None: the destination is written in place.
    temporary: Option<std::path::PathBuf>,
    destination: std::path::PathBuf,
    committed: bool,
}

impl Replacement {
    /// Creates the temporary file (`.NAME.partial-PID` in the destination's directory, so
    /// that the rename stays within one file system) and returns it with its guard; or opens
    /// a destination that is not a regular file for writing.
    pub fn create(destination: &std::path::Path) -> io::Result<(std::fs::File, Self)> {
        if std::fs::metadata(destination).is_ok_and(|metadata| !metadata.is_file() && !metadata.is_dir()) {
            let file = std::fs::OpenOptions::new().write(true).open(destination)?;
            return Ok((file, Self { temporary: None, destination: destination.to_path_buf(), committed: false }));
        }
        let name = destination.file_name().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{}: not a file name", destination.display()))
        })?;
        let mut temporary_name = std::ffi::OsString::from(".");
        temporary_name.push(name);
        temporary_name.push(format!(".partial-{}", std::process::id()));
        let temporary = destination.with_file_name(temporary_name);
        let file = std::fs::File::create(&temporary)?;
        Ok((file, Self { temporary: Some(temporary), destination: destination.to_path_buf(), committed: false }))
    }

    /// Renames the finished file over the destination (write and flush it first).
    pub fn commit(mut self) -> io::Result<()> {
        if let Some(temporary) = &self.temporary {
            std::fs::rename(temporary, &self.destination)?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Replacement {
    fn drop(&mut self) {
        if !self.committed
            && let Some(temporary) = &self.temporary
        {
            let _ = std::fs::remove_file(temporary);
        }
    }
}

#[cfg(test)]
mod replacement_tests {
    use std::io::Write;

    use super::Replacement;

    fn names(directory: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(directory)
            .expect("read dir")
            .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_destination_changes_only_when_committed() {
        let directory = tempfile::tempdir().expect("temp dir");
        let destination = directory.path().join("capture.jsonl");
        std::fs::write(&destination, "kept\n").expect("write");
        // Abandoned half-way: the old content stays, nothing else is left.
        {
            let (mut file, _guard) = Replacement::create(&destination).expect("create");
            file.write_all(b"half of a new one").expect("write");
        }
        assert_eq!(std::fs::read_to_string(&destination).expect("read"), "kept\n");
        assert_eq!(names(directory.path()), ["capture.jsonl"]);
        // Committed: replaced whole.
        let (mut file, guard) = Replacement::create(&destination).expect("create");
        file.write_all(b"new\n").expect("write");
        drop(file);
        guard.commit().expect("commit");
        assert_eq!(std::fs::read_to_string(&destination).expect("read"), "new\n");
        assert_eq!(names(directory.path()), ["capture.jsonl"]);
    }

    /// `sim --out /dev/null` renamed a file over `/dev/null` (as root, the device was gone).
    /// Through a link to it, so that a regression replaces the link, not the device.
    #[test]
    fn a_destination_that_is_a_device_is_written_in_place() {
        use std::os::unix::fs::FileTypeExt;
        let directory = tempfile::tempdir().expect("temp dir");
        let destination = directory.path().join("out");
        std::os::unix::fs::symlink("/dev/null", &destination).expect("link");
        let (mut file, guard) = Replacement::create(&destination).expect("create");
        file.write_all(b"thrown away\n").expect("write");
        drop(file);
        guard.commit().expect("commit");
        let link = std::fs::symlink_metadata(&destination).expect("the link");
        assert!(link.file_type().is_symlink(), "the link was replaced: {link:?}");
        assert!(std::fs::metadata(&destination).expect("/dev/null").file_type().is_char_device());
        assert_eq!(names(directory.path()), ["out"], "no temporary file left");
    }
}
