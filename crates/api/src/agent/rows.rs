//! The breakdown's per-parameter and per-layer rows and DP-SGD's memory
//! (`memprof_agent._rows`, `memprof_agent._dpsgd`): bounded lists with the
//! totals of what they leave out, shared by the push and the reports (the
//! same fields on both sides, so they cannot drift), and their checks.

use super::{bound_len, bound_str, Error, MAX_PARAMETER_NAME, MAX_SHAPE_DIMS};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many parameter rows and this many layer rows: the breakdown
/// rides on every push (64 KiB each) and is stored whole in a MemoryReport
/// and a MemoryProfile. The agent also keeps each list within a few KiB of
/// JSON (`_rows.py`: 16 real rows fit, rows at their longest stop sooner),
/// and the left-out totals carry the rest.
pub const MAX_ROWS: usize = 16;
/// At most this many bytes in a row's `dtype` (`float32`, `bfloat16`, …).
pub const MAX_DTYPE: usize = 32;

/// One parameter (seed 001's model analysis).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterRow {
    /// Its name (`named_parameters()`; long names keep their end).
    #[schemars(length(max = 128))]
    pub name: String,
    /// Its shape (at most 8 dimensions).
    #[serde(default)]
    #[schemars(length(max = 8))]
    pub shape: Vec<u64>,
    /// Its dtype without `torch.` (`float32`, `bfloat16`).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub dtype: String,
    /// Its bytes (elements x element size).
    pub bytes: u64,
    /// Whether it requires gradients.
    pub trainable: bool,
}

/// One layer: a parameter's owning module cut after its first numbered
/// element (`model.layers.3`), or the owning module outside the blocks.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LayerRow {
    /// The layer's module path (`(model)`: the model's own parameters).
    #[schemars(length(max = 128))]
    pub name: String,
    /// Its parameters.
    pub parameters: u64,
    /// Those that require gradients.
    pub trainable_parameters: u64,
    /// Bytes of its parameters.
    pub bytes: u64,
}

/// What the rows a list left out add up to, so nothing is silently lost.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RowsLeftOut {
    /// Rows left out.
    pub rows: u64,
    /// Their parameters.
    pub parameters: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Whether a DP-SGD number was measured or modelled.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Tensors the parameters hold, counted.
    #[default]
    Measured,
    /// What Opacus allocates, computed from shapes (docs/agent.md says how).
    Modelled,
}

/// DP-SGD's memory beside the per-sample gradients (seed 004).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DpSgd {
    /// Samples per step, the per-sample tensors' first dimension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Parameters holding per-sample state.
    pub parameters: u64,
    /// Bytes of the per-sample gradient norms: held in `_norm_sample`
    /// (measured), or what the optimizer's clipping allocates (modelled).
    pub norms_bytes: u64,
    /// `measured` or `modelled`.
    #[schemars(with = "Source")]
    pub norms_source: String,
    /// Ghost clipping's ggT and aaT of the largest layer (modelled:
    /// 2 x samples x T^2 elements), when the trainer gave T.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_matrices_bytes: Option<u64>,
    /// The sequence length T the temporary matrices were modelled with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_length: Option<u64>,
}

fn broken(why: String) -> Result<(), Error> {
    Err(Error::Breakdown { why })
}

/// Checks the rows' bounds and that each layer's numbers can be true.
pub(super) fn validate_rows(params: &[ParameterRow], layers: &[LayerRow]) -> Result<(), Error> {
    bound_len("breakdown.parameterRows", params.len(), MAX_ROWS)?;
    for (i, r) in params.iter().enumerate() {
        let at = |f: &str| format!("breakdown.parameterRows[{i}].{f}");
        bound_str(|| at("name"), &r.name, MAX_PARAMETER_NAME)?;
        bound_str(|| at("dtype"), &r.dtype, MAX_DTYPE)?;
        bound_len(&at("shape"), r.shape.len(), MAX_SHAPE_DIMS)?;
    }
    bound_len("breakdown.layerRows", layers.len(), MAX_ROWS)?;
    for (i, r) in layers.iter().enumerate() {
        bound_str(
            || format!("breakdown.layerRows[{i}].name"),
            &r.name,
            MAX_PARAMETER_NAME,
        )?;
        if r.trainable_parameters > r.parameters {
            return broken(format!(
                "layerRows[{i}].trainableParameters {} exceeds its parameters {}",
                r.trainable_parameters, r.parameters
            ));
        }
    }
    Ok(())
}

/// Checks that a DP-SGD object names its source.
pub(super) fn validate_dp_sgd(d: &DpSgd) -> Result<(), Error> {
    if !matches!(d.norms_source.as_str(), "measured" | "modelled") {
        return broken(format!(
            "dpSgd.normsSource {:?} is not one of measured, modelled",
            d.norms_source
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{parse, validate, Breakdown, Push, VERSION};
    use super::*;

    fn push_with(b: Breakdown) -> Push {
        Push {
            version: VERSION,
            time: 1.8e9,
            breakdown: Some(b),
            ..Default::default()
        }
    }

    fn refusal(b: Breakdown) -> String {
        validate(&push_with(b)).unwrap_err().to_string()
    }

    /// Every row at its longest, both lists full, a DP-SGD object.
    fn full() -> Breakdown {
        Breakdown {
            parameter_rows: vec![
                ParameterRow {
                    name: "p".repeat(MAX_PARAMETER_NAME),
                    shape: vec![u64::MAX; MAX_SHAPE_DIMS],
                    dtype: "d".repeat(MAX_DTYPE),
                    bytes: u64::MAX,
                    trainable: false,
                };
                MAX_ROWS
            ],
            parameters_left_out: Some(RowsLeftOut {
                rows: u64::MAX,
                parameters: u64::MAX,
                bytes: u64::MAX,
            }),
            layer_rows: vec![
                LayerRow {
                    name: "l".repeat(MAX_PARAMETER_NAME),
                    parameters: u64::MAX,
                    trainable_parameters: u64::MAX,
                    bytes: u64::MAX,
                };
                MAX_ROWS
            ],
            layers_left_out: Some(RowsLeftOut::default()),
            dp_sgd: Some(DpSgd {
                samples: Some(32),
                parameters: 4,
                norms_bytes: 1024,
                norms_source: "modelled".into(),
                temp_matrices_bytes: Some(1 << 30),
                sequence_length: Some(4096),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn rows_at_their_bounds_pass_and_add_about_10k() {
        assert_eq!(validate(&push_with(full())), Ok(()));
        let b = full();
        let rows = serde_json::to_vec(&(&b.parameter_rows, &b.layer_rows)).unwrap();
        assert!(rows.len() < 11 * 1024, "{} bytes", rows.len());
    }

    #[test]
    fn documented_rows_parse_from_the_agents_json() {
        let body = br#"{"version": 1, "time": 1795000000.5, "breakdown": {"totalParameters": 10,
            "trainableParameters": 4, "parametersBytes": 40, "gradientsBytes": 0,
            "optimizerBytes": 0, "staticBytes": 40,
            "parameterRows": [{"name": "lm_head.weight", "shape": [2, 3], "dtype": "bfloat16",
              "bytes": 12, "trainable": true}],
            "parametersLeftOut": {"rows": 2, "parameters": 4, "bytes": 28},
            "layerRows": [{"name": "layers.0", "parameters": 10, "trainableParameters": 4,
              "bytes": 40}],
            "dpSgd": {"samples": 8, "parameters": 2, "normsBytes": 64, "normsSource": "measured"}}}"#;
        let b = parse(body).unwrap().breakdown.unwrap();
        assert_eq!(b.parameter_rows[0].shape, vec![2, 3]);
        assert!(b.parameter_rows[0].trainable);
        assert_eq!(b.parameters_left_out.unwrap().bytes, 28);
        assert_eq!(b.layer_rows[0].trainable_parameters, 4);
        assert_eq!(b.dp_sgd.unwrap().temp_matrices_bytes, None);
    }

    #[test]
    fn rows_past_their_bounds_or_impossible_are_refused_by_field() {
        let mut b = full();
        b.parameter_rows.push(ParameterRow::default());
        assert_eq!(
            refusal(b),
            "breakdown.parameterRows has 17 entries, at most 16 are accepted"
        );
        let mut b = full();
        b.layer_rows.push(LayerRow::default());
        assert!(refusal(b).starts_with("breakdown.layerRows has 17 entries"));
        let mut b = full();
        b.parameter_rows[3].shape.push(1);
        assert_eq!(
            refusal(b),
            "breakdown.parameterRows[3].shape has 9 entries, at most 8 are accepted"
        );
        let mut b = full();
        b.parameter_rows[0].dtype.push('x');
        assert!(refusal(b).starts_with("breakdown.parameterRows[0].dtype is 33 bytes"));
        let mut b = full();
        b.layer_rows[1].name.push('x');
        assert!(refusal(b).starts_with("breakdown.layerRows[1].name is 129 bytes"));
        let mut b = full();
        b.layer_rows[2].parameters = 1;
        assert!(refusal(b).contains("layerRows[2].trainableParameters"));
        let mut b = full();
        b.dp_sgd.as_mut().unwrap().norms_source = "guessed".into();
        assert!(refusal(b).contains("dpSgd.normsSource \"guessed\" is not one of"));
    }
}
