//! Node outputs: the Rust types a node may return.

use weft_types as types;

use crate::{AssetRef, Audio, Image, Latent, Mask, OutputSpec, Value};

/// A type a node output can have. Its `TYPE_NAME` is the ComfyUI type reported by
/// `describe()`.
pub trait OutputType {
    /// ComfyUI type name, for example `STRING`.
    const TYPE_NAME: &'static str;

    /// Wraps the value for the host.
    fn into_value(self) -> Value;
}

macro_rules! output_type {
    ($($ty:ty => |$v:ident| $e:expr, $name:expr;)*) => {$(
        impl OutputType for $ty {
            const TYPE_NAME: &'static str = $name;

            fn into_value(self) -> Value {
                let $v = self;
                $e
            }
        }
    )*};
}

output_type! {
    String => |v| Value::Text(v), types::STRING;
    i64 => |v| Value::Int(v), types::INT;
    u32 => |v| Value::Int(i64::from(v)), types::INT;
    f64 => |v| Value::Float(v), types::FLOAT;
    bool => |v| Value::Boolean(v), types::BOOLEAN;
    AssetRef => |v| Value::Asset(v), types::ASSET;
    Image => |v| Value::Image(v), types::IMAGE;
    Latent => |v| Value::Latent(v), types::LATENT;
    Mask => |v| Value::Mask(v), types::MASK;
    Audio => |v| Value::Audio(v), types::AUDIO;
}

/// A tuple of outputs, as a node's `execute` returns them: `()`, `(A,)`, `(A, B)`, ...
pub trait IntoOutputs {
    /// The values in declaration order.
    fn into_outputs(self) -> Vec<Value>;
}

macro_rules! tuple_outputs {
    ($(($($t:ident),*);)*) => {$(
        impl<$($t: OutputType),*> IntoOutputs for ($($t,)*) {
            #[allow(non_snake_case)]
            fn into_outputs(self) -> Vec<Value> {
                let ($($t,)*) = self;
                vec![$($t.into_value()),*]
            }
        }
    )*};
}

tuple_outputs! {
    (A);
    (A, B);
    (A, B, C);
    (A, B, C, D);
    (A, B, C, D, E);
    (A, B, C, D, E, F);
    (A, B, C, D, E, F, G);
    (A, B, C, D, E, F, G, H);
    (A, B, C, D, E, F, G, H, I);
    (A, B, C, D, E, F, G, H, I, J);
    (A, B, C, D, E, F, G, H, I, J, K);
    (A, B, C, D, E, F, G, H, I, J, K, L);
}

impl IntoOutputs for () {
    fn into_outputs(self) -> Vec<Value> {
        Vec::new()
    }
}

/// Builds the `output-spec` of output `name` of type `T` (used by [`node!`](crate::node)).
pub fn output_spec<T: OutputType>(name: &str) -> OutputSpec {
    OutputSpec {
        type_name: T::TYPE_NAME.to_string(),
        name: name.to_string(),
        is_list: false,
        tooltip: None,
    }
}
