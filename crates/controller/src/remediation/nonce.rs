//! The nonce a recreated Job carries (`memprof.dev/remediation-nonce`): 128
//! random bits, hex, made once per plan and saved with it. The id alone
//! can be computed by anyone who reads the policy and the Job, so only the
//! nonce tells the Job this controller created from one a tenant labelled
//! (`verify::created_from`). Made here, not in `memprof_policy::plan`, so
//! that planning stays a pure function of its input.

/// A fresh nonce: 128 random bits from the operating system, hex.
pub fn nonce() -> String {
    use ring::rand::SecureRandom as _;
    use std::fmt::Write as _;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the operating system's random generator works");
    bytes.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_128_bits_of_hex_and_differ() {
        let n = nonce();
        assert_eq!(n.len(), 32);
        assert!(n.bytes().all(|b| b.is_ascii_hexdigit()), "{n}");
        assert_ne!(nonce(), nonce());
    }
}
