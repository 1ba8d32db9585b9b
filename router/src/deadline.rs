//! The gRPC deadline of a call: the `grpc-timeout` request header (gRPC over HTTP/2: at most 8
//! digits and a unit, `H` hours, `M` minutes, `S` seconds, `m` milliseconds, `u` microseconds,
//! `n` nanoseconds).

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The call's timeout from its `grpc-timeout` header; `None` when absent or malformed (a malformed
/// header is ignored, as tonic's own server does).
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    parse(metadata.get("grpc-timeout")?.to_str().ok()?)
}

/// Parses a `grpc-timeout` value such as `"1500m"`.
pub fn parse(value: &str) -> Option<Duration> {
    if value.len() < 2 || !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_rejects_junk() {
        assert_eq!(parse("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("4S"), Some(Duration::from_secs(4)));
        assert_eq!(parse("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "m", "123456789m", "12x", "-1S", "1.5S", "１S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reads_the_header_set_by_tonic_clients() {
        let mut request = tonic::Request::new(());
        request.set_timeout(Duration::from_millis(250));
        assert_eq!(
            grpc_timeout(request.metadata()),
            Some(Duration::from_millis(250))
        );
        assert_eq!(grpc_timeout(&MetadataMap::new()), None);
    }
}
