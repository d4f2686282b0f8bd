//! Node inputs: the Rust types a node may take, and the spec builder that describes them.
//!
//! The Rust type of an input decides its ComfyUI type (`String` is `STRING`, `i64` is
//! `INT`, `Option<T>` makes it optional, ...); a [`Spec`] adds what the type cannot say
//! (default, range, choices, tooltip). Start one with the function named after the
//! type, for example [`string()`], [`int()`] or [`combo()`].

use std::marker::PhantomData;

use weft_types as types;

use crate::json::JsonLiteral;
use crate::{
    AssetRef, Audio, Clip, Conditioning, ControlNet, Image, InputSpec, Latent, Mask, Model, NamedValue, NodeError,
    UpscaleModel, Vae, Value,
};

/// The ComfyUI name of the type of `value`, for error messages.
pub fn value_type_name(value: &Value) -> String {
    match value {
        Value::Int(_) => types::INT.into(),
        Value::Float(_) => types::FLOAT.into(),
        Value::Boolean(_) => types::BOOLEAN.into(),
        Value::Text(_) => types::STRING.into(),
        Value::Json(_) => types::JSON.into(),
        Value::Asset(_) => types::ASSET.into(),
        Value::Image(_) => types::IMAGE.into(),
        Value::Latent(_) => types::LATENT.into(),
        Value::Mask(_) => types::MASK.into(),
        Value::Audio(_) => types::AUDIO.into(),
        Value::Handle(h) => h.type_name(),
    }
}

fn wrong_type(name: &str, expected: &str, got: &Value) -> NodeError {
    NodeError::invalid_input(format!(
        "input `{name}`: expected {expected}, got {}",
        value_type_name(got)
    ))
}

/// A type a node input can have. Its `TYPE_NAME` is the ComfyUI type reported by
/// `describe()`.
pub trait InputType: Sized {
    /// ComfyUI type name, for example `INT` or `IMAGE`.
    const TYPE_NAME: &'static str;

    /// Converts the value the host passed for input `name`.
    fn from_value(name: &str, value: Value) -> Result<Self, NodeError>;

    /// Checks the converted value against the spec (range, choices).
    fn validate(&self, _name: &str, _spec: &Spec<Self>) -> Result<(), NodeError> {
        Ok(())
    }
}

/// What a field of a node's `inputs { ... }` can be: an [`InputType`] (a required
/// input) or `Option` of one (an optional input).
pub trait Input: Sized {
    /// The input's type without `Option`.
    type Base: InputType;
    /// Whether a workflow must give the input, unless the spec says otherwise.
    const REQUIRED: bool;

    /// Converts the value given for `name` (`None` when the workflow left it out).
    fn from_input(name: &str, value: Option<Value>, spec: Spec<Self::Base>) -> Result<Self, NodeError>;
}

fn convert<T: InputType>(name: &str, value: Value, spec: &Spec<T>) -> Result<T, NodeError> {
    let v = T::from_value(name, value)?;
    v.validate(name, spec)?;
    Ok(v)
}

impl<T: InputType> Input for T {
    type Base = T;
    const REQUIRED: bool = true;

    fn from_input(name: &str, value: Option<Value>, spec: Spec<T>) -> Result<T, NodeError> {
        match value {
            Some(value) => convert(name, value, &spec),
            None => spec
                .default
                .ok_or_else(|| NodeError::invalid_input(format!("missing required input `{name}`"))),
        }
    }
}

impl<T: InputType> Input for Option<T> {
    type Base = T;
    const REQUIRED: bool = false;

    fn from_input(name: &str, value: Option<Value>, spec: Spec<T>) -> Result<Option<T>, NodeError> {
        match value {
            Some(value) => convert(name, value, &spec).map(Some),
            None => Ok(spec.default),
        }
    }
}

/// The spec of one input: its ComfyUI options beyond the type.
///
/// Built with the functions of this module and chained setters:
/// `input::int().default(512).min(1).max(16384)`.
pub struct Spec<T> {
    type_name: Option<&'static str>,
    required: Option<bool>,
    default: Option<T>,
    default_json: Option<String>,
    min: Option<f64>,
    max: Option<f64>,
    step: Option<f64>,
    options: Vec<String>,
    multiline: bool,
    tooltip: Option<String>,
    model_folder: Option<String>,
    _type: PhantomData<fn() -> T>,
}

/// A spec for an input of type `T`, with nothing set.
pub fn spec<T>() -> Spec<T> {
    Spec {
        type_name: None,
        required: None,
        default: None,
        default_json: None,
        min: None,
        max: None,
        step: None,
        options: Vec::new(),
        multiline: false,
        tooltip: None,
        model_folder: None,
        _type: PhantomData,
    }
}

/// A `STRING` input.
pub fn string() -> Spec<String> {
    spec()
}

/// An `INT` input.
pub fn int() -> Spec<i64> {
    spec()
}

/// An `INT` input read as `u32` (negative or too large values are rejected).
pub fn uint() -> Spec<u32> {
    spec()
}

/// An `INT` input read as `u64`, such as a seed (negative values are rejected).
pub fn uint64() -> Spec<u64> {
    spec()
}

/// A `FLOAT` input.
pub fn float() -> Spec<f64> {
    spec()
}

/// A `BOOLEAN` input.
pub fn boolean() -> Spec<bool> {
    spec()
}

/// A `COMBO` input: one of `options`, received as a `String`.
pub fn combo<S: Into<String>>(options: impl IntoIterator<Item = S>) -> Spec<String> {
    string().options(options)
}

/// A `COMBO` of the model files in the models folder `folder` (`checkpoints`, `loras`,
/// `vae`, `embeddings`), listed by the host whenever the catalogue is asked for.
pub fn model_file(folder: &str) -> Spec<String> {
    let mut spec = combo(Vec::<String>::new());
    spec.model_folder = Some(folder.to_string());
    spec
}

/// A `core/ASSET` input (an uploaded file).
pub fn asset() -> Spec<AssetRef> {
    spec()
}

/// An `IMAGE` input.
pub fn image() -> Spec<Image> {
    spec()
}

/// A `MASK` input.
pub fn mask() -> Spec<Mask> {
    spec()
}

/// A `LATENT` input.
pub fn latent() -> Spec<Latent> {
    spec()
}

/// An `AUDIO` input.
pub fn audio() -> Spec<Audio> {
    spec()
}

/// A `MODEL` input.
pub fn model() -> Spec<Model> {
    spec()
}

/// A `CLIP` input.
pub fn clip() -> Spec<Clip> {
    spec()
}

/// A `VAE` input.
pub fn vae() -> Spec<Vae> {
    spec()
}

/// A `CONTROL_NET` input.
pub fn control_net() -> Spec<ControlNet> {
    spec()
}

/// An `UPSCALE_MODEL` input.
pub fn upscale_model() -> Spec<UpscaleModel> {
    spec()
}

/// A `CONDITIONING` input.
pub fn conditioning() -> Spec<Conditioning> {
    spec()
}

impl<T> Spec<T> {
    /// Reports `name` as the ComfyUI type instead of the Rust type's.
    pub fn type_name(mut self, name: &'static str) -> Self {
        self.type_name = Some(name);
        self
    }

    /// Whether a workflow must give the input (default: required unless the field is
    /// an `Option`). A left-out input with a default gets the default.
    pub fn required(mut self, required: bool) -> Self {
        self.required = Some(required);
        self
    }

    /// Same as `.required(false)`.
    pub fn optional(self) -> Self {
        self.required(false)
    }

    /// Help text shown for the input.
    pub fn tooltip(mut self, text: impl Into<String>) -> Self {
        self.tooltip = Some(text.into());
        self
    }

    /// The default, as JSON text, when one was set.
    pub fn default_json(&self) -> Option<&str> {
        self.default_json.as_deref()
    }

    /// The choices of a combo.
    pub fn choices(&self) -> &[String] {
        &self.options
    }

    /// Builds the `input-spec` record for an input named `name` of field type `I`.
    pub fn to_input_spec<I: Input<Base = T>>(&self, name: &str) -> InputSpec
    where
        T: InputType,
    {
        InputSpec {
            name: name.to_string(),
            type_name: self.type_name.unwrap_or(T::TYPE_NAME).to_string(),
            required: self.required.unwrap_or(I::REQUIRED),
            default: self.default_json.clone(),
            min: self.min,
            max: self.max,
            step: self.step,
            options: self.options.clone(),
            multiline: self.multiline,
            tooltip: self.tooltip.clone(),
            model_folder: self.model_folder.clone(),
        }
    }

    fn set_default(mut self, value: T) -> Self
    where
        T: JsonLiteral,
    {
        self.default_json = Some(value.to_json());
        self.default = Some(value);
        self
    }
}

impl Spec<String> {
    /// The default value.
    pub fn default(self, value: impl Into<String>) -> Self {
        self.set_default(value.into())
    }

    /// Edits the string as multiple lines.
    pub fn multiline(mut self) -> Self {
        self.multiline = true;
        self
    }

    /// Makes the input a `COMBO` of `options`, like [`combo()`].
    pub fn options<S: Into<String>>(mut self, options: impl IntoIterator<Item = S>) -> Self {
        self.options = options.into_iter().map(Into::into).collect();
        self.type_name = Some(types::COMBO);
        self
    }
}

impl Spec<bool> {
    /// The default value.
    pub fn default(self, value: bool) -> Self {
        self.set_default(value)
    }
}

macro_rules! numeric_spec {
    ($($ty:ty),*) => {$(
        impl Spec<$ty> {
            /// The default value.
            pub fn default(self, value: $ty) -> Self {
                self.set_default(value)
            }

            /// Smallest accepted value.
            pub fn min(mut self, value: $ty) -> Self {
                self.min = Some(value as f64);
                self
            }

            /// Largest accepted value.
            pub fn max(mut self, value: $ty) -> Self {
                self.max = Some(value as f64);
                self
            }

            /// UI step.
            pub fn step(mut self, value: $ty) -> Self {
                self.step = Some(value as f64);
                self
            }
        }
    )*};
}

numeric_spec!(i64, u32, u64, f64);

fn check_range(
    name: &str,
    v: f64,
    shown: &dyn std::fmt::Display,
    min: Option<f64>,
    max: Option<f64>,
) -> Result<(), NodeError> {
    if let Some(min) = min {
        if v < min {
            return Err(NodeError::invalid_input(format!(
                "input `{name}`: {shown} is smaller than the minimum {min}"
            )));
        }
    }
    if let Some(max) = max {
        if v > max {
            return Err(NodeError::invalid_input(format!(
                "input `{name}`: {shown} is larger than the maximum {max}"
            )));
        }
    }
    Ok(())
}

impl InputType for String {
    const TYPE_NAME: &'static str = types::STRING;

    fn from_value(name: &str, value: Value) -> Result<Self, NodeError> {
        match value {
            Value::Text(s) => Ok(s),
            other => Err(wrong_type(name, types::STRING, &other)),
        }
    }

    fn validate(&self, name: &str, spec: &Spec<Self>) -> Result<(), NodeError> {
        // Model-file choices are listed (and checked) by the host.
        if spec.options.is_empty() || spec.model_folder.is_some() || spec.options.contains(self) {
            Ok(())
        } else {
            Err(NodeError::invalid_input(format!(
                "input `{name}`: `{self}` is not one of {:?}",
                spec.options
            )))
        }
    }
}

impl InputType for i64 {
    const TYPE_NAME: &'static str = types::INT;

    fn from_value(name: &str, value: Value) -> Result<Self, NodeError> {
        match value {
            Value::Int(i) => Ok(i),
            Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(f as i64),
            other => Err(wrong_type(name, types::INT, &other)),
        }
    }

    fn validate(&self, name: &str, spec: &Spec<Self>) -> Result<(), NodeError> {
        check_range(name, *self as f64, self, spec.min, spec.max)
    }
}

impl InputType for u32 {
    const TYPE_NAME: &'static str = types::INT;

    fn from_value(name: &str, value: Value) -> Result<Self, NodeError> {
        let i = i64::from_value(name, value)?;
        u32::try_from(i)
            .map_err(|_| NodeError::invalid_input(format!("input `{name}`: {i} is out of range 0..=4294967295")))
    }

    fn validate(&self, name: &str, spec: &Spec<Self>) -> Result<(), NodeError> {
        check_range(name, *self as f64, self, spec.min, spec.max)
    }
}

impl InputType for u64 {
    const TYPE_NAME: &'static str = "INT";

    fn from_value(name: &str, value: Value) -> Result<Self, NodeError> {
        let i = i64::from_value(name, value)?;
        u64::try_from(i).map_err(|_| NodeError::invalid_input(format!("input `{name}`: {i} is negative")))
    }

    fn validate(&self, name: &str, spec: &Spec<Self>) -> Result<(), NodeError> {
        check_range(name, *self as f64, self, spec.min, spec.max)
    }
}

impl InputType for f64 {
    const TYPE_NAME: &'static str = types::FLOAT;

    fn from_value(name: &str, value: Value) -> Result<Self, NodeError> {
        match value {
            Value::Float(f) => Ok(f),
            Value::Int(i) => Ok(i as f64),
            other => Err(wrong_type(name, types::FLOAT, &other)),
        }
    }

    fn validate(&self, name: &str, spec: &Spec<Self>) -> Result<(), NodeError> {
        check_range(name, *self, self, spec.min, spec.max)
    }
}

impl InputType for bool {
    const TYPE_NAME: &'static str = types::BOOLEAN;

    fn from_value(name: &str, value: Value) -> Result<Self, NodeError> {
        match value {
            Value::Boolean(b) => Ok(b),
            other => Err(wrong_type(name, types::BOOLEAN, &other)),
        }
    }
}

/// Any value (ComfyUI's `*` type): the node receives whatever is linked or given.
impl InputType for Value {
    const TYPE_NAME: &'static str = types::ANY;

    fn from_value(_name: &str, value: Value) -> Result<Self, NodeError> {
        Ok(value)
    }
}

macro_rules! variant_input {
    ($($ty:ty => $variant:ident, $type_name:expr;)*) => {$(
        impl InputType for $ty {
            const TYPE_NAME: &'static str = $type_name;

            fn from_value(name: &str, value: Value) -> Result<Self, NodeError> {
                match value {
                    Value::$variant(v) => Ok(v),
                    other => Err(wrong_type(name, $type_name, &other)),
                }
            }
        }
    )*};
}

variant_input! {
    AssetRef => Asset, types::ASSET;
    Image => Image, types::IMAGE;
    Latent => Latent, types::LATENT;
    Mask => Mask, types::MASK;
    Audio => Audio, types::AUDIO;
}

/// The inputs `execute` received, by name.
pub struct InputValues {
    values: Vec<NamedValue>,
}

impl InputValues {
    /// Wraps the list the host passed.
    pub fn new(values: Vec<NamedValue>) -> Self {
        InputValues { values }
    }

    /// Removes and returns the value of input `name` (the last one, if given twice).
    pub fn take(&mut self, name: &str) -> Option<Value> {
        let i = self.values.iter().rposition(|v| v.name == name)?;
        Some(self.values.swap_remove(i).value)
    }

    /// Names of the inputs not taken yet.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(|v| v.name.as_str())
    }
}

/// Builds the `input-spec` of field `name` of type `I` (used by [`node!`](crate::node)).
pub fn input_spec<I: Input>(name: &str, spec: Spec<I::Base>) -> InputSpec {
    spec.to_input_spec::<I>(name)
}

/// Takes and converts input `name` of field type `I` (used by [`node!`](crate::node)).
pub fn take_input<I: Input>(inputs: &mut InputValues, name: &str, spec: Spec<I::Base>) -> Result<I, NodeError> {
    I::from_input(name, inputs.take(name), spec)
}
