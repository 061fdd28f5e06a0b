//! Engine time and its JSON form (whole microseconds).

use std::time::Duration;

/// A point in engine time: the duration since an epoch the caller chooses (see the module docs
/// of [`crate::engine`]). Serialized as whole microseconds, in fields named `*_us`.
pub type Time = Duration;

/// Microseconds in a `u64`, saturating (a `u64` of microseconds spans 584,000 years).
pub(crate) fn micros(t: Duration) -> u64 {
    u64::try_from(t.as_micros()).unwrap_or(u64::MAX)
}

/// `#[serde(with = "us")]`: a [`Duration`] as whole microseconds.
pub(crate) mod us {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(t: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(super::micros(*t))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_micros)
    }
}

/// `#[serde(with = "opt_us")]`: an `Option<Duration>` as whole microseconds or `null`
/// (serialization only).
pub(crate) mod opt_us {
    use std::time::Duration;

    use serde::Serializer;

    #[expect(
        clippy::ref_option,
        reason = "serde's `with` hands the field over by reference: `&Option<Duration>`"
    )]
    pub(crate) fn serialize<S: Serializer>(t: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_some(&super::micros(*t)),
            None => s.serialize_none(),
        }
    }
}

/// Renders engine time as seconds with millisecond precision: `12.345s`.
pub(crate) fn show(t: Duration) -> String {
    format!("{}.{:03}s", t.as_secs(), t.subsec_millis())
}
