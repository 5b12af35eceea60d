//! Rows in COPY's text format: tab-separated, `\N` for NULL, backslash escapes for the
//! characters that would end a field or a row. PostgreSQL's text type cannot hold NUL, which
//! untrusted telemetry may contain: it becomes U+FFFD here and in bound values ([`text`]).

use std::borrow::Cow;

use sqlx::PgConnection;

use crate::Result;

/// Text PostgreSQL accepts: NUL replaced by U+FFFD.
pub(crate) fn text(value: &str) -> Cow<'_, str> {
    if value.contains('\0') { Cow::Owned(value.replace('\0', "\u{FFFD}")) } else { Cow::Borrowed(value) }
}

/// Rows being written for one `COPY ... FROM STDIN`.
#[derive(Default)]
pub(crate) struct CopyRows {
    buffer: Vec<u8>,
    /// Whether the current row has a field yet (fields after the first need a tab).
    in_row: bool,
    rows: usize,
}

/// Bytes sent to the server per CopyData message.
const CHUNK: usize = 1 << 20;

impl CopyRows {
    fn separate(&mut self) {
        if self.in_row {
            self.buffer.push(b'\t');
        }
        self.in_row = true;
    }

    pub(crate) fn null(&mut self) -> &mut Self {
        self.separate();
        self.buffer.extend_from_slice(b"\\N");
        self
    }

    pub(crate) fn text(&mut self, value: &str) -> &mut Self {
        self.separate();
        for character in value.chars() {
            match character {
                '\\' => self.buffer.extend_from_slice(b"\\\\"),
                '\t' => self.buffer.extend_from_slice(b"\\t"),
                '\n' => self.buffer.extend_from_slice(b"\\n"),
                '\r' => self.buffer.extend_from_slice(b"\\r"),
                '\0' => self.buffer.extend_from_slice("\u{FFFD}".as_bytes()),
                other => {
                    let mut utf8 = [0; 4];
                    self.buffer.extend_from_slice(other.encode_utf8(&mut utf8).as_bytes());
                }
            }
        }
        self
    }

    pub(crate) fn opt_text(&mut self, value: Option<&str>) -> &mut Self {
        match value {
            Some(value) => self.text(value),
            None => self.null(),
        }
    }

    pub(crate) fn int(&mut self, value: i64) -> &mut Self {
        self.separate();
        self.buffer.extend_from_slice(value.to_string().as_bytes());
        self
    }

    pub(crate) fn opt_int(&mut self, value: Option<i64>) -> &mut Self {
        match value {
            Some(value) => self.int(value),
            None => self.null(),
        }
    }

    /// Finite numbers only (callers map NaN and infinities to NULL, as SQLite stores them).
    pub(crate) fn opt_float(&mut self, value: Option<f64>) -> &mut Self {
        match value.filter(|value| value.is_finite()) {
            Some(value) => {
                self.separate();
                // Rust's shortest round-trip rendering; PostgreSQL reads it back exactly.
                self.buffer.extend_from_slice(format!("{value:?}").as_bytes());
                self
            }
            None => self.null(),
        }
    }

    pub(crate) fn opt_bool(&mut self, value: Option<bool>) -> &mut Self {
        match value {
            Some(value) => {
                self.separate();
                self.buffer.push(if value { b't' } else { b'f' });
                self
            }
            None => self.null(),
        }
    }

    pub(crate) fn end_row(&mut self) -> &mut Self {
        self.buffer.push(b'\n');
        self.in_row = false;
        self.rows += 1;
        self
    }

    /// Runs `statement` (a `COPY ... FROM STDIN`) and streams the rows; returns the rows
    /// the server took.
    pub(crate) async fn send(&self, connection: &mut PgConnection, statement: &str) -> Result<u64> {
        if self.rows == 0 {
            return Ok(0);
        }
        let mut copy = connection.copy_in_raw(statement).await?;
        for chunk in self.buffer.chunks(CHUNK) {
            if let Err(error) = copy.send(chunk).await {
                // The connection must leave COPY mode before it is used (or returned) again.
                let _ = copy.abort("lagscope could not send the rows").await;
                return Err(error.into());
            }
        }
        Ok(copy.finish().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_escaped_and_nulls_marked() {
        let mut rows = CopyRows::default();
        rows.text("a\tb\\c\nd\re\0").opt_text(None).int(-7).opt_bool(Some(true)).opt_float(Some(0.1)).end_row();
        rows.opt_float(Some(f64::NAN)).opt_int(None).end_row();
        assert_eq!(
            String::from_utf8(rows.buffer).expect("utf-8"),
            "a\\tb\\\\c\\nd\\re\u{FFFD}\t\\N\t-7\tt\t0.1\n\\N\t\\N\n"
        );
        assert_eq!(text("x\0y"), "x\u{FFFD}y");
    }
}
