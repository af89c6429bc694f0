//! Small text helpers shared by the sub-machines.

/// The longest prefix of `s` of at most `max_bytes` bytes that ends on a character boundary
/// (`s` itself when it fits). No marker is added; callers that show the cut add their own.
pub(crate) fn utf8_prefix(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut end = max_bytes;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_never_splits_a_character() {
        assert_eq!(utf8_prefix("héllo", 10), "héllo");
        assert_eq!(
            utf8_prefix("héllo", 2),
            "h",
            "é is two bytes: cut before it"
        );
        assert_eq!(utf8_prefix("héllo", 3), "hé");
        assert_eq!(utf8_prefix("🐝", 3), "");
        assert_eq!(utf8_prefix("", 0), "");
    }
}
