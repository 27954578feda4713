//! `--gpu`: a GPU model's name or a memory size, as the bytes a trainer on
//! it can have. A named card is its `memory.total` as nvidia-smi prints it
//! (MiB) less what the driver keeps: on the H200 we measured, torch's
//! `total_memory` was 614 MiB under nvidia-smi's figure, and the same is
//! taken off every card (an estimate never rounds in the user's disfavour).

/// The memory nvidia-smi reports and torch cannot have, measured on an H200.
pub const DRIVER_KEPT_MIB: u64 = 614;

/// Known cards: (name as typed, case-insensitive; nvidia-smi memory.total in MiB).
pub const MODELS: &[(&str, u64)] = &[
    ("H100-80GB", 81_559),
    ("H100-94GB", 95_830),
    ("H200", 143_771),
    ("A100-80GB", 81_920),
    ("A100-40GB", 40_960),
    ("L40S", 46_068),
    ("L4", 23_034),
    ("A10G", 23_028),
    ("V100-32GB", 32_768),
    ("V100-16GB", 16_384),
];

/// The GPU an estimate is judged against.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    /// As typed (a model name, or the memory size).
    pub name: String,
    /// Bytes a process can have on it.
    pub total_bytes: u64,
    /// Whether the name was a model of [`MODELS`] (else a size typed by the user).
    pub named: bool,
}

/// Why `--gpu` was not understood.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("unknown --gpu {given:?}: use a model ({known}) or a memory size such as 80GiB")]
pub struct UnknownGpu {
    /// What was typed.
    pub given: String,
    /// The models known, comma-separated.
    pub known: String,
}

/// Parses `--gpu`: a model of [`MODELS`] or a size (`80GiB`, `40GB`, bytes).
pub fn parse(given: &str) -> Result<Gpu, UnknownGpu> {
    let model = MODELS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(given.trim()));
    if let Some((name, mib)) = model {
        return Ok(Gpu {
            name: (*name).to_string(),
            total_bytes: (mib - DRIVER_KEPT_MIB) << 20,
            named: true,
        });
    }
    let starts_with_digit = given.trim().starts_with(|c: char| c.is_ascii_digit());
    match memprof_api::parse_bytes(given) {
        Ok(bytes) if starts_with_digit && bytes > 0 => Ok(Gpu {
            name: given.trim().to_string(),
            total_bytes: bytes,
            named: false,
        }),
        _ => Err(UnknownGpu {
            given: given.to_string(),
            known: MODELS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_its_memory_less_what_the_driver_keeps() {
        let g = parse("h100-80gb").unwrap();
        assert_eq!(g.name, "H100-80GB");
        assert_eq!(g.total_bytes, (81_559 - 614) << 20);
        assert!(g.named);
    }

    #[test]
    fn a_size_is_taken_as_typed() {
        let g = parse("80GiB").unwrap();
        assert_eq!(g.total_bytes, 80 << 30);
        assert!(!g.named);
    }

    #[test]
    fn an_unknown_name_says_what_to_type() {
        let e = parse("H300").unwrap_err().to_string();
        assert!(e.contains("H100-80GB") && e.contains("80GiB"), "{e}");
        assert!(parse("0").is_err());
    }
}
