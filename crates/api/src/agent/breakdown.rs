//! The `breakdown` of a push (`memprof_agent.breakdown`): what holds the
//! trainer's memory. Types and their checks; the rest of the push is in
//! [`crate::agent`].
//!
//! Why checked: the profile's batch recommendation builds on `staticBytes`
//! and `activationsPeakBytes`, so numbers that cannot all be true (a static
//! part smaller than the parameters it includes) are refused with the field
//! named, like the allocator's.

use super::rows::{DpSgd, LayerRow, ParameterRow, RowsLeftOut, MAX_ROWS};
use super::{
    bound_len, bound_str, Error, MAX_FLAGS, MAX_FLAG_NOTE, MAX_MODULE_PHASES, MAX_MODULE_TYPES,
    MAX_PARAMETER_NAME,
};
// A module phase is one type on the wire and in the report: the report
// carries the agent's phases as they came (bounded by `validate`).
use crate::{FlagKind, ModulePhase, ModuleType};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// Not the report's MemoryBreakdown, which adds whose and when (pod, rank, pid,
// time) and holds module types and flag kinds as enums: strings here, so that
// `validate` names the field of a wrong one.
/// The trainer's memory broken down (`memprof_agent.breakdown`): bytes in
/// parameters, gradients and optimizer state, by module type, and what the
/// activations add at the peak of a step. Bytes unless said otherwise.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    /// Step at which it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Parameters of the model.
    pub total_parameters: u64,
    /// Parameters that require gradients.
    pub trainable_parameters: u64,
    /// Bytes of parameters.
    pub parameters_bytes: u64,
    /// Bytes of gradients.
    pub gradients_bytes: u64,
    /// Bytes of optimizer state.
    pub optimizer_bytes: u64,
    /// Bytes of per-sample gradients (Opacus `grad_sample`), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_sample_gradients_bytes: Option<u64>,
    /// parameters + gradients + optimizer (+ per-sample gradients).
    pub static_bytes: u64,
    /// Peak allocated during the measured step minus the static part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activations_peak_bytes: Option<u64>,
    /// Samples per step, when the trainer told it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    /// Bytes per module type, at most [`MAX_MODULE_TYPES`], each type once.
    #[serde(default)]
    #[schemars(length(max = MAX_MODULE_TYPES))]
    pub by_module_type: Vec<ModuleTypeBytes>,
    /// Flagged parameters, at most [`MAX_FLAGS`].
    #[serde(default)]
    #[schemars(length(max = MAX_FLAGS))]
    pub flags: Vec<Flag>,
    /// Per top-level module (`trace_modules`), at most [`MAX_MODULE_PHASES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_MODULE_PHASES))]
    pub phases: Option<Vec<ModulePhase>>,
    /// Peak of the optimizer step above what it started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_step_peak_bytes: Option<u64>,
    /// The largest parameters by bytes, at most [`MAX_ROWS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ROWS))]
    pub parameter_rows: Vec<ParameterRow>,
    /// What the parameters left out of `parameterRows` add up to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_left_out: Option<RowsLeftOut>,
    /// The largest layers by bytes, at most [`MAX_ROWS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ROWS))]
    pub layer_rows: Vec<LayerRow>,
    /// What the layers left out of `layerRows` add up to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers_left_out: Option<RowsLeftOut>,
    /// DP-SGD's per-sample gradient norms and temporary matrices, when
    /// parameters hold per-sample state (Opacus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_sgd: Option<DpSgd>,
}

// The report's twin is crate::ModuleTypeBytes, with the type as the enum.
/// The parameters of one module type. `type` is a string here, checked by
/// [`validate`], so a wrong one is refused with its field's name.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleTypeBytes {
    /// `attention`, `mlp`, `embedding`, `norm`, `lora` or `other`.
    #[serde(rename = "type")]
    #[schemars(with = "ModuleType")]
    pub type_: String,
    /// Parameters of modules of this type.
    pub parameters: u64,
    /// Their bytes.
    pub parameters_bytes: u64,
    /// Their gradients' bytes.
    pub gradients_bytes: u64,
    /// Their optimizer state's bytes.
    pub optimizer_bytes: u64,
}

// Not the report's ParameterFlag (kind as FlagKind): a string here, so that
// `validate` names the field of a wrong one.
/// A flagged parameter.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Flag {
    /// `nan`, `inf` or `large`.
    #[schemars(with = "FlagKind")]
    pub kind: String,
    /// Parameter name.
    #[serde(default)]
    #[schemars(length(max = MAX_PARAMETER_NAME))]
    pub parameter: String,
    /// Detail.
    #[serde(default)]
    #[schemars(length(max = MAX_FLAG_NOTE))]
    pub note: String,
}

fn broken(why: String) -> Result<(), Error> {
    Err(Error::Breakdown { why })
}

/// Checks a breakdown's bounds and that its numbers can all be true.
pub(super) fn validate(b: &Breakdown) -> Result<(), Error> {
    if b.trainable_parameters > b.total_parameters {
        return broken(format!(
            "trainableParameters {} exceeds totalParameters {}",
            b.trainable_parameters, b.total_parameters
        ));
    }
    // u128: four u64 byte counts cannot overflow it.
    let parts = u128::from(b.parameters_bytes)
        + u128::from(b.gradients_bytes)
        + u128::from(b.optimizer_bytes)
        + u128::from(b.per_sample_gradients_bytes.unwrap_or(0));
    if u128::from(b.static_bytes) < parts {
        return broken(format!(
            "staticBytes {} is less than parametersBytes + gradientsBytes + optimizerBytes \
             + perSampleGradientsBytes = {parts}",
            b.static_bytes
        ));
    }
    validate_module_types(&b.by_module_type)?;
    bound_len("breakdown.flags", b.flags.len(), MAX_FLAGS)?;
    for (i, f) in b.flags.iter().enumerate() {
        if FlagKind::parse(&f.kind).is_none() {
            return broken(format!(
                "flags[{i}].kind {:?} is not one of nan, inf, large",
                f.kind
            ));
        }
        bound_str(
            || format!("breakdown.flags[{i}].parameter"),
            &f.parameter,
            MAX_PARAMETER_NAME,
        )?;
        bound_str(
            || format!("breakdown.flags[{i}].note"),
            &f.note,
            MAX_FLAG_NOTE,
        )?;
    }
    super::rows::validate_rows(&b.parameter_rows, &b.layer_rows)?;
    if let Some(d) = &b.dp_sgd {
        super::rows::validate_dp_sgd(d)?;
    }
    let phases = b.phases.as_deref().unwrap_or_default();
    bound_len("breakdown.phases", phases.len(), MAX_MODULE_PHASES)?;
    for (i, p) in phases.iter().enumerate() {
        bound_str(
            || format!("breakdown.phases[{i}].module"),
            &p.module,
            MAX_PARAMETER_NAME,
        )?;
    }
    Ok(())
}

fn validate_module_types(types: &[ModuleTypeBytes]) -> Result<(), Error> {
    bound_len("breakdown.byModuleType", types.len(), MAX_MODULE_TYPES)?;
    let mut seen = Vec::with_capacity(types.len());
    for (i, m) in types.iter().enumerate() {
        let Some(t) = ModuleType::parse(&m.type_) else {
            return broken(format!(
                "byModuleType[{i}].type {:?} is not one of attention, mlp, embedding, norm, \
                 lora, other",
                m.type_
            ));
        };
        if seen.contains(&t) {
            return broken(format!(
                "byModuleType[{i}].type {:?} appears twice",
                m.type_
            ));
        }
        seen.push(t);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{parse, validate as validate_push, Push, VERSION};
    use super::*;

    const M: u64 = 1 << 20;

    /// A LoRA fine-tune's breakdown, as docs/agent.md shows it.
    pub(crate) fn breakdown() -> Breakdown {
        Breakdown {
            step: Some(3),
            total_parameters: 124_000_000,
            trainable_parameters: 800_000,
            parameters_bytes: 496 * M,
            gradients_bytes: 3 * M,
            optimizer_bytes: 6 * M,
            per_sample_gradients_bytes: None,
            static_bytes: 505 * M,
            activations_peak_bytes: Some(2048 * M),
            batch_size: Some(16),
            by_module_type: vec![ModuleTypeBytes {
                type_: "lora".into(),
                parameters: 800_000,
                parameters_bytes: 3 * M,
                gradients_bytes: 3 * M,
                optimizer_bytes: 6 * M,
            }],
            flags: vec![Flag {
                kind: "large".into(),
                parameter: "lm_head.weight".into(),
                note: "12x its layer's median".into(),
            }],
            phases: Some(vec![ModulePhase {
                module: "transformer".into(),
                forward_bytes: 1500 * M,
                backward_bytes: 400 * M,
            }]),
            optimizer_step_peak_bytes: Some(12 * M),
            ..Default::default()
        }
    }

    fn push_with(b: Breakdown) -> Push {
        Push {
            version: VERSION,
            time: 1.8e9,
            breakdown: Some(b),
            ..Default::default()
        }
    }

    fn refusal(b: Breakdown) -> String {
        validate_push(&push_with(b)).unwrap_err().to_string()
    }

    #[test]
    fn a_documented_breakdown_parses_and_an_absent_one_is_fine() {
        let body = br#"{"version": 1, "time": 1795000000.5, "pid": 4242, "rank": 0,
            "breakdown": {"step": 3, "totalParameters": 124000000, "trainableParameters": 800000,
              "parametersBytes": 496000000, "gradientsBytes": 3200000, "optimizerBytes": 6400000,
              "perSampleGradientsBytes": null, "staticBytes": 505600000,
              "activationsPeakBytes": 2100000000, "batchSize": 16,
              "byModuleType": [{"type": "attention", "parameters": 28000000,
                "parametersBytes": 112000000, "gradientsBytes": 0, "optimizerBytes": 0},
                {"type": "lora", "parameters": 800000, "parametersBytes": 3200000,
                "gradientsBytes": 3200000, "optimizerBytes": 6400000}],
              "flags": [{"kind": "nan", "parameter": "h.3.mlp.c_fc.weight", "note": "2 NaN"}],
              "phases": null, "optimizerStepPeakBytes": 12800000, "someFutureField": 1}}"#;
        let p = parse(body).unwrap();
        let b = p.breakdown.unwrap();
        assert_eq!((b.static_bytes, b.batch_size), (505_600_000, Some(16)));
        assert_eq!(b.by_module_type[1].type_, "lora");
        assert_eq!(b.phases, None);
        assert!(validate_push(&push_with(breakdown())).is_ok());
        assert!(validate_push(&Push {
            breakdown: None,
            ..push_with(breakdown())
        })
        .is_ok());
    }

    #[test]
    fn a_static_part_smaller_than_what_it_includes_is_refused() {
        let mut b = breakdown();
        b.static_bytes = 504 * M;
        let err = refusal(b);
        assert!(
            err.starts_with("breakdown: staticBytes 528482304 is less than"),
            "{err}"
        );
        // Per-sample gradients are part of the static part too.
        let mut b = breakdown();
        b.per_sample_gradients_bytes = Some(M);
        assert!(refusal(b).contains("perSampleGradientsBytes = 530579456"));
        // Sums that overflow u64 are compared exactly, not wrapped.
        let mut b = breakdown();
        b.parameters_bytes = u64::MAX;
        b.gradients_bytes = u64::MAX;
        b.static_bytes = u64::MAX;
        assert!(refusal(b).contains("staticBytes"));
    }

    #[test]
    fn more_trainable_than_total_parameters_is_refused() {
        let mut b = breakdown();
        b.trainable_parameters = b.total_parameters + 1;
        let err = refusal(b);
        assert!(
            err.contains("trainableParameters 124000001 exceeds totalParameters 124000000"),
            "{err}"
        );
    }

    #[test]
    fn unknown_or_repeated_module_types_and_flag_kinds_are_refused_by_field() {
        let mut b = breakdown();
        b.by_module_type[0].type_ = "conv".into();
        assert!(refusal(b).contains("byModuleType[0].type \"conv\" is not one of"));
        let mut b = breakdown();
        b.by_module_type.push(b.by_module_type[0].clone());
        assert!(refusal(b).contains("byModuleType[1].type \"lora\" appears twice"));
        let mut b = breakdown();
        b.flags[0].kind = "weird".into();
        assert!(refusal(b).contains("flags[0].kind \"weird\" is not one of nan, inf, large"));
    }

    #[test]
    fn every_list_and_string_is_bounded() {
        let mut b = breakdown();
        b.by_module_type = ModuleType::ALL
            .iter()
            .chain([ModuleType::Other].iter())
            .map(|t| ModuleTypeBytes {
                type_: t.as_str().into(),
                ..Default::default()
            })
            .collect();
        assert_eq!(
            refusal(b),
            "breakdown.byModuleType has 7 entries, at most 6 are accepted"
        );
        let mut b = breakdown();
        b.flags = vec![b.flags[0].clone(); MAX_FLAGS + 1];
        assert_eq!(
            refusal(b),
            "breakdown.flags has 17 entries, at most 16 are accepted"
        );
        let mut b = breakdown();
        b.flags[0].parameter = "p".repeat(MAX_PARAMETER_NAME + 1);
        assert_eq!(
            refusal(b),
            "breakdown.flags[0].parameter is 129 bytes long, at most 128 are accepted"
        );
        let mut b = breakdown();
        b.flags[0].note = "n".repeat(MAX_FLAG_NOTE + 1);
        assert!(refusal(b).starts_with("breakdown.flags[0].note is 257 bytes"));
        let mut b = breakdown();
        b.phases = Some(vec![ModulePhase::default(); MAX_MODULE_PHASES + 1]);
        assert_eq!(
            refusal(b),
            "breakdown.phases has 33 entries, at most 32 are accepted"
        );
        let mut b = breakdown();
        b.phases.as_mut().unwrap()[0].module = "m".repeat(MAX_PARAMETER_NAME + 1);
        assert!(refusal(b).starts_with("breakdown.phases[0].module is 129 bytes"));
    }
}
