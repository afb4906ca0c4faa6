//! `namespaced_fingerprint(namespace, fingerprint)`: the key a record of a source with a
//! `key_namespace` has in a table fed by several sources (docs/formats.md#namespaced_fingerprint):
//! SHA-256 of the UTF-8 text `"{namespace}|{fingerprint}"`, as 64 lowercase hex characters.
//! A namespace starts with a letter and a fingerprint's text with its version's digits, so a
//! namespaced key never equals a plain one; null in, null out.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{ScalarValue, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};
use sha2::{Digest, Sha256};

/// The namespaced key of `fingerprint` (hex text) in `namespace`.
pub fn namespaced_fingerprint(namespace: &str, fingerprint: &str) -> String {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update(b"|");
    h.update(fingerprint.as_bytes());
    let digest: [u8; 32] = h.finalize().into();
    let mut out = [0u8; 64];
    super::hex_lower(&digest, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The SQL function (see the module documentation).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NamespacedFingerprint {
    signature: Signature,
}

impl Default for NamespacedFingerprint {
    fn default() -> Self {
        NamespacedFingerprint {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

pub fn namespaced_fingerprint_udf() -> ScalarUDF {
    ScalarUDF::from(NamespacedFingerprint::default())
}

impl ScalarUDFImpl for NamespacedFingerprint {
    fn name(&self) -> &str {
        "namespaced_fingerprint"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != 2 {
            return plan_err!(
                "namespaced_fingerprint(namespace, fingerprint) takes 2 arguments, got {}",
                arg_types.len()
            );
        }
        for (i, t) in arg_types.iter().enumerate() {
            let text = matches!(
                t,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
            ) || matches!(t, DataType::Dictionary(_, v) if v.as_ref() == &DataType::Utf8);
            if !text {
                return plan_err!("namespaced_fingerprint: argument {} must be a string, got {t}", i + 1);
            }
        }
        Ok(vec![DataType::Utf8, DataType::Utf8])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let n = if scalar { 1 } else { args.number_rows };
        let arrays: Vec<ArrayRef> = args
            .args
            .iter()
            .map(|a| a.to_array(n).and_then(|a| Ok(cast(&a, &DataType::Utf8)?)))
            .collect::<Result<_>>()?;
        let (ns, fp) = (arrays[0].as_string::<i32>(), arrays[1].as_string::<i32>());
        let mut out = StringBuilder::with_capacity(n, n * 64);
        for i in 0..n {
            if ns.is_null(i) || fp.is_null(i) {
                out.append_null();
            } else {
                out.append_value(namespaced_fingerprint(ns.value(i), fp.value(i)));
            }
        }
        let out: ArrayRef = Arc::new(out.finish());
        if scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
        } else {
            Ok(ColumnarValue::Array(out))
        }
    }
}
