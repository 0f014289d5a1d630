//! An ETag as a mount pins it ([`Etag`]), in the one form pins are compared in
//! ([`canonical_etag`]). Beside the stack's bottom: the catalog holds one per object,
//! the cache records them in its part files, and [`crate::object`] sends and checks
//! them; this module imports nothing of the crate.

use std::fmt;
use std::ops::Deref;

/// An ETag as pinned: a string, held in place when it is at most [`Etag::INLINE`]
/// bytes (a hex MD5 in quotes, S3's and most stores' ETag of an object written in one
/// piece, is 34; a multipart upload's `"<md5>-<parts>"` up to 999 parts) and on the
/// heap otherwise. A catalog of 10^5 objects holds one per object: a `String` cost 24
/// bytes and an allocation of 48 beside them, this costs 40 and none
/// (`etags_are_held_in_place`). Read as a `&str` in its header form, as the fetcher
/// writes it into a part file's header and sends it as `If-Match`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Etag(EtagBytes);

#[derive(Clone, PartialEq, Eq, Hash)]
enum EtagBytes {
    /// The first `len` bytes of `bytes`, a whole UTF-8 string.
    Inline {
        len: u8,
        bytes: [u8; Etag::INLINE],
    },
    Heap(Box<str>),
}

impl Etag {
    /// The longest ETag held in place.
    pub const INLINE: usize = 38;

    /// `parts` written one after the other.
    fn concat(parts: &[&str]) -> Etag {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > Etag::INLINE {
            return Etag(EtagBytes::Heap(parts.concat().into_boxed_str()));
        }
        let mut bytes = [0u8; Etag::INLINE];
        let mut at = 0;
        for part in parts {
            bytes[at..at + part.len()].copy_from_slice(part.as_bytes());
            at += part.len();
        }
        Etag(EtagBytes::Inline {
            len: len as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            EtagBytes::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..*len as usize]).expect("made from whole strings")
            }
            EtagBytes::Heap(tag) => tag,
        }
    }
}

impl Deref for Etag {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Etag {
    /// The ETag `tag` as it is (see [`canonical_etag`] for a listed one).
    fn from(tag: &str) -> Etag {
        Etag::concat(&[tag])
    }
}

impl From<String> for Etag {
    fn from(tag: String) -> Etag {
        Etag::concat(&[&tag])
    }
}

impl PartialEq<str> for Etag {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Etag {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An ETag in its HTTP header form, quoted (`"abc"` or `W/"abc"`), whatever form the
/// store listed it in: GCS's JSON listing and some WebDAV servers (WsgiDAV) give it
/// bare, while their GET answers quote it. Pinned ETags are sent as `If-Match` and
/// compared with the ETag of each answer, so both sides must be in the same form.
pub fn canonical_etag(tag: &str) -> Etag {
    if tag.starts_with('"') || tag.starts_with("W/\"") {
        Etag::from(tag)
    } else {
        Etag::concat(&["\"", tag, "\""])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_take_their_quoted_header_form() {
        assert_eq!(canonical_etag("\"abc\""), "\"abc\"");
        assert_eq!(canonical_etag("W/\"abc\""), "W/\"abc\"");
        assert_eq!(
            canonical_etag("pD9KxgjJ00wUA68b6YuF7w=="),
            "\"pD9KxgjJ00wUA68b6YuF7w==\""
        );
        assert_eq!(canonical_etag("1-2-3"), "\"1-2-3\"");
    }

    #[test]
    fn etags_are_held_in_place() {
        assert!(std::mem::size_of::<Option<Etag>>() <= 40);
        let md5 = canonical_etag("9b2cf535f27731c974343645a3985328");
        assert!(matches!(md5.0, EtagBytes::Inline { len: 34, .. }));
        assert_eq!(md5, "\"9b2cf535f27731c974343645a3985328\"");
        let multipart = canonical_etag("9b2cf535f27731c974343645a3985328-999");
        assert!(matches!(multipart.0, EtagBytes::Inline { .. }));
        let long = canonical_etag("9b2cf535f27731c974343645a3985328-10000");
        assert!(matches!(long.0, EtagBytes::Heap(_)));
        assert_eq!(long, "\"9b2cf535f27731c974343645a3985328-10000\"");
        assert_eq!(Etag::from(""), "");
    }

    proptest::proptest! {
        /// Held in place or not, an ETag reads back as the string it was made of, and
        /// equal strings make equal ETags.
        #[test]
        fn an_etag_reads_back_as_made(tag in "\\PC{0,60}", other in "\\PC{0,60}") {
            let etag = Etag::from(tag.as_str());
            proptest::prop_assert_eq!(etag.as_str(), tag.as_str());
            proptest::prop_assert_eq!(etag.clone(), Etag::from(tag.clone()));
            let other_etag = Etag::from(other.as_str());
            proptest::prop_assert_eq!(etag == other_etag, tag == other);
            let quoted = canonical_etag(&tag);
            let expected = if tag.starts_with('"') || tag.starts_with("W/\"") {
                tag.clone()
            } else {
                format!("\"{tag}\"")
            };
            proptest::prop_assert_eq!(quoted.as_str(), expected.as_str());
        }
    }
}
