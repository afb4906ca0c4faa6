//! [`Text`]: the immutable string of a log record's text fields.
//!
//! A checkpoint holds a row per run of a source, and every command reads one: with a `String` per
//! value, decoding 10,000 records made 70,000 allocations (and as many frees), about half the
//! decode. A `Text` decoded from an Arrow string column shares the column's buffer instead (a
//! reference count, no copy); one made from a `String` owns its bytes. Either way it reads as a
//! `&str` (`Deref`), compares with strings and prints as one.
//!
//! Hazard: a `Text` keeps the whole buffer of the column it came from alive (a few kilobytes per
//! batch of records); nothing holds records long enough for that to matter.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use datafusion::arrow::array::{Array, StringArray};
use datafusion::arrow::buffer::Buffer;

/// An immutable UTF-8 string, owned or shared with the Arrow buffer it was decoded from.
///
/// Invariant: the bytes are valid UTF-8. Every constructor takes them from a `str`, or from a
/// value of a [`StringArray`], whose values Arrow keeps valid UTF-8 (its own `value` relies on it).
#[derive(Clone)]
pub struct Text(Buffer);

impl Text {
    /// The value at `row` of `array` (not null), sharing the array's buffer.
    pub fn of(array: &StringArray, row: usize) -> Text {
        let offsets = array.value_offsets();
        let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
        Text(array.values().slice_with_length(start, end - start))
    }

    /// The value at `row` of `array`, `None` when it is null.
    pub fn of_opt(array: &StringArray, row: usize) -> Option<Text> {
        (!array.is_null(row)).then(|| Text::of(array, row))
    }

    pub fn as_str(&self) -> &str {
        // SAFETY: the bytes are valid UTF-8 (the type's invariant: they come from a `str` or from
        // a value of a `StringArray`, which Arrow validates when the array is made).
        unsafe { std::str::from_utf8_unchecked(self.0.as_slice()) }
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text(Buffer::from_vec(s.into_bytes()))
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text(Buffer::from(s.as_bytes()))
    }
}

impl From<&String> for Text {
    fn from(s: &String) -> Text {
        Text::from(s.as_str())
    }
}

impl From<Text> for String {
    fn from(t: Text) -> String {
        t.as_str().to_string()
    }
}

impl Default for Text {
    fn default() -> Text {
        Text::from("")
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Text> for str {
    fn eq(&self, other: &Text) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Text> for &str {
    fn eq(&self, other: &Text) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Text> for String {
    fn eq(&self, other: &Text) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialOrd for Text {
    fn partial_cmp(&self, other: &Text) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Text {
    fn cmp(&self, other: &Text) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Text {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl serde::Serialize for Text {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
