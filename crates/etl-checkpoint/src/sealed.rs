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

/// The body of a sealed file, once its checksum line matches; otherwise
/// why it cannot be trusted.
///
/// # Errors
///
/// Not UTF-8, no checksum line (a torn write), or a checksum that does
/// not match the body.
pub fn unseal(bytes: &[u8]) -> Result<&str, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|i| i + 1)
        .ok_or("truncated")?;
    let (body, trailer) = text.split_at(body_end);
    let crc = trailer
        .trim_end()
        .strip_prefix("crc32 ")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("missing checksum (torn write?)")?;
    if crc32fast::hash(body.as_bytes()) != crc {
        return Err("checksum mismatch".to_owned());
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
        assert_eq!(
            unseal(altered.as_bytes()),
            Err("checksum mismatch".to_owned())
        );
        assert!(unseal(b"head\n").is_err());
    }
}
