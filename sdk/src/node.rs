//! The node trait and the plugin's `describe` / `execute` dispatch.

use crate::{Context, InputValues, NamedValue, NodeDef, NodeError, NodeResult, Value};

/// One node class. Implemented by [`node!`](crate::node); implement it by hand only for
/// something the macro cannot express.
pub trait Node {
    /// The class's name, its definition's `class_type`: a call is dispatched by it without
    /// building every definition.
    fn class_type() -> std::borrow::Cow<'static, str> {
        Self::definition().class_type.into()
    }

    /// The class's definition, as `describe()` reports it.
    fn definition() -> NodeDef;

    /// Runs the node: converts `inputs`, computes, and returns one value per output.
    fn run(ctx: &mut Context, inputs: InputValues) -> Result<Vec<Value>, NodeError>;
}

/// A node class in a plugin's table (see [`export_plugin!`](crate::export_plugin)).
#[derive(Clone, Copy)]
pub struct NodeEntry {
    /// [`Node::class_type`] of the class.
    pub class_type: fn() -> std::borrow::Cow<'static, str>,
    /// [`Node::definition`] of the class.
    pub definition: fn() -> NodeDef,
    /// [`Node::run`] of the class.
    pub run: fn(&mut Context, InputValues) -> Result<Vec<Value>, NodeError>,
}

impl NodeEntry {
    /// The entry for node class `N`.
    pub const fn of<N: Node>() -> Self {
        NodeEntry {
            class_type: N::class_type,
            definition: N::definition,
            run: N::run,
        }
    }
}

/// `describe()` for a plugin made of `nodes`.
pub fn describe(nodes: &[NodeEntry]) -> Vec<NodeDef> {
    nodes.iter().map(|n| (n.definition)()).collect()
}

/// `execute()` for a plugin made of `nodes`: runs the node whose class is `class_type`,
/// or fails with code `unknown_class`.
pub fn execute(nodes: &[NodeEntry], class_type: &str, inputs: Vec<NamedValue>) -> Result<NodeResult, NodeError> {
    let Some(entry) = nodes.iter().find(|n| (n.class_type)() == class_type) else {
        return Err(NodeError::new(
            crate::NodeErrorCode::UnknownClass,
            format!("this plugin has no node class `{class_type}`"),
        ));
    };
    let mut ctx = Context::new();
    let outputs = (entry.run)(&mut ctx, InputValues::new(inputs))?;
    Ok(NodeResult {
        outputs,
        files: ctx.into_files(),
    })
}
