//! Small state files sealed with a checksum: a text body followed by a
//! `crc32 <hex>` line over it, so a torn or corrupted file is told apart
//! from a valid one. The offset store and the file source's record of its
//! inputs are both written this way.

/// Append the checksum line to `body` (which ends with a line break).
///
/// ```
/// let mut text = String::from("etl-example 1\nvalue 42\n");
/// etl_checkpoint::seal(&mut text);
/// assert_eq!(etl_checkpoint::unseal(text.as_bytes()), Ok("etl-example 1\nvalue 42\n"));
/// ```
pub fn seal(body: &mut String) {
    let crc = crc32fast::hash(body.as_bytes());
    body.push_str(&format!("crc32 {crc:08x}\n"));
}

/// Why a sealed file's bytes cannot be trusted ([`unseal`]). The file's
/// name is its reader's to add.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnsealError {
    /// The bytes are not UTF-8 text.
    #[error("not UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    /// Fewer than two lines: no body before a checksum line.
    #[error("truncated")]
    Truncated,
    /// The last line is no `crc32 <hex>` line (a torn write?).
    #[error("missing checksum (torn write?)")]
    MissingChecksum,
    /// The checksum line does not match the body.
    #[error("checksum mismatch")]
    ChecksumMismatch {
        /// The checksum the file's last line holds.
        stored: u32,
        /// The checksum of the body as read.
        computed: u32,
    },
}

/// The body of a sealed file, once its checksum line matches; otherwise
/// why it cannot be trusted.
///
/// # Errors
///
/// Not UTF-8, no checksum line (a torn write), or a checksum that does
/// not match the body: an [`UnsealError`].
pub fn unseal(bytes: &[u8]) -> Result<&str, UnsealError> {
    let text = std::str::from_utf8(bytes).map_err(UnsealError::NotUtf8)?;
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|i| i + 1)
        .ok_or(UnsealError::Truncated)?;
    let (body, trailer) = text.split_at(body_end);
    let stored = trailer
        .trim_end()
        .strip_prefix("crc32 ")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or(UnsealError::MissingChecksum)?;
    let computed = crc32fast::hash(body.as_bytes());
    if computed != stored {
        return Err(UnsealError::ChecksumMismatch { stored, computed });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_or_altered_file_is_refused() {
        let mut text = String::from("head\nline\n");
        seal(&mut text);
        assert_eq!(unseal(text.as_bytes()), Ok("head\nline\n"));
        let torn = &text.as_bytes()[..text.len() - 4];
        assert!(unseal(torn).is_err());
        let altered = text.replace("line", "lime");
        let err = unseal(altered.as_bytes()).unwrap_err();
        assert!(
            matches!(err, UnsealError::ChecksumMismatch { .. }),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "checksum mismatch");
        assert_eq!(unseal(b"head\n"), Err(UnsealError::Truncated));
        assert_eq!(
            unseal(b"head\nline\n").map_err(|e| e.to_string()),
            Err("missing checksum (torn write?)".to_owned())
        );
    }

    #[test]
    fn bytes_that_are_not_text_keep_the_utf8_error_as_their_source() {
        let err = unseal(b"head\n\xff\ncrc32 00000000\n").unwrap_err();
        assert_eq!(err.to_string(), "not UTF-8");
        let source = std::error::Error::source(&err).expect("a source");
        assert!(source.is::<std::str::Utf8Error>(), "{source:?}");
    }
}
