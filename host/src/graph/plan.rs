//! Planning: which nodes run (the output nodes and their ancestors), in what order, and the
//! cache key of each.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::workflow::{as_link, RawNode};
use crate::runtime::{NodeDef, Value};

/// Where one input of a planned node comes from.
#[derive(Debug, Clone)]
pub enum PlanInput {
    /// Output `output` of the planned node at `node` (an index into [`Plan::nodes`]).
    Link {
        /// Index of the source node in the plan.
        node: usize,
        /// Output index of the source.
        output: usize,
    },
    /// A literal value from the workflow.
    Literal(Value),
}

/// A node that will run.
#[derive(Debug, Clone)]
pub struct PlannedNode {
    /// Node id in the workflow.
    pub id: String,
    /// Class.
    pub class_type: String,
    /// Inputs by name, in the class's declared order.
    pub inputs: Vec<(String, PlanInput)>,
    /// Whether the node commits job outputs.
    pub output_node: bool,
    /// Cache key: class, literal inputs and the keys of linked ancestors. `None` when the
    /// node or an ancestor is non-deterministic (never cached).
    pub cache_key: Option<[u8; 32]>,
}

/// An executable plan: nodes in dependency order.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Nodes in an order where every link points backwards.
    pub nodes: Vec<PlannedNode>,
}

impl Plan {
    /// For each node, the plan indices of nodes it links to.
    pub fn dependencies(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.nodes[index].inputs.iter().filter_map(|(_, i)| match i {
            PlanInput::Link { node, .. } => Some(*node),
            PlanInput::Literal(_) => None,
        })
    }
}

/// `outputs` and everything they depend on.
pub(super) fn ancestors<'a>(outputs: &[&'a str], nodes: &HashMap<&'a str, RawNode<'a>>) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = outputs.to_vec();
    while let Some(id) = stack.pop() {
        let Some((&key, node)) = nodes.get_key_value(id) else {
            continue;
        };
        if seen.insert(key) {
            stack.extend(node.links().filter(|n| nodes.contains_key(n)));
        }
    }
    seen
}

/// The cycles among `needed`, each as the node ids on it (Tarjan's strongly connected
/// components with more than one node, or a node linking to itself).
pub(super) fn cycles(needed: &BTreeSet<&str>, nodes: &HashMap<&str, RawNode>) -> Vec<Vec<String>> {
    struct Tarjan<'a, 'b> {
        nodes: &'b HashMap<&'a str, RawNode<'a>>,
        needed: &'b BTreeSet<&'a str>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: HashSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a, '_> {
        // Iterative, so a 100,000-node chain cannot overflow the host stack.
        fn run(&mut self, root: &'a str) {
            let mut work: Vec<(&'a str, Vec<&'a str>)> = Vec::new();
            self.visit(root, &mut work);
            while let Some((id, pending)) = work.last_mut() {
                let id = *id;
                if let Some(next) = pending.pop() {
                    if !self.index.contains_key(next) {
                        self.visit(next, &mut work);
                    } else if self.on_stack.contains(next) {
                        let low = self.low[id].min(self.index[next]);
                        self.low.insert(id, low);
                    }
                    continue;
                }
                work.pop();
                if let Some((parent, _)) = work.last() {
                    let low = self.low[parent].min(self.low[id]);
                    self.low.insert(parent, low);
                }
                if self.low[id] == self.index[id] {
                    let mut component = Vec::new();
                    while let Some(member) = self.stack.pop() {
                        self.on_stack.remove(member);
                        component.push(member.to_string());
                        if member == id {
                            break;
                        }
                    }
                    let self_loop = self.nodes[id].links().any(|n| n == id);
                    if component.len() > 1 || self_loop {
                        component.reverse();
                        self.found.push(component);
                    }
                }
            }
        }

        fn visit(&mut self, id: &'a str, work: &mut Vec<(&'a str, Vec<&'a str>)>) {
            self.index.insert(id, self.next);
            self.low.insert(id, self.next);
            self.next += 1;
            self.stack.push(id);
            self.on_stack.insert(id);
            let succ: Vec<&'a str> = self.nodes[id]
                .links()
                .filter_map(|n| self.nodes.get_key_value(n).map(|(k, _)| *k))
                .filter(|n| self.needed.contains(n))
                .collect();
            work.push((id, succ));
        }
    }
    let mut t = Tarjan {
        nodes,
        needed,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: HashSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for id in needed {
        if !t.index.contains_key(id) {
            t.run(id);
        }
    }
    t.found
}

/// Orders the (acyclic, validated) `needed` nodes and computes their cache keys.
pub(super) fn build(
    needed: &BTreeSet<&str>,
    nodes: &HashMap<&str, RawNode>,
    defs: &HashMap<&str, &NodeDef>,
    mut literals: HashMap<(String, String), Value>,
) -> Plan {
    // Depth-first post-order gives dependencies first; iterative for deep chains.
    let mut order: Vec<&str> = Vec::with_capacity(needed.len());
    let mut placed: HashSet<&str> = HashSet::with_capacity(needed.len());
    for &root in needed {
        let mut stack = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if placed.contains(id) {
                continue;
            }
            if expanded {
                placed.insert(id);
                order.push(id);
                continue;
            }
            stack.push((id, true));
            for dep in nodes[id].links() {
                if let Some((&key, _)) = nodes.get_key_value(dep) {
                    if !placed.contains(key) {
                        stack.push((key, false));
                    }
                }
            }
        }
    }
    let position: HashMap<&str, usize> = order.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut planned: Vec<PlannedNode> = Vec::with_capacity(order.len());
    for id in order {
        let def = defs[id];
        let raw = &nodes[id];
        let mut inputs = Vec::with_capacity(def.inputs.len());
        let mut hasher = blake3::Hasher::new();
        hasher.update(def.class_type.as_bytes());
        hasher.update(b"\0");
        hasher.update(def.build.as_bytes());
        let mut cacheable = def.deterministic;
        for spec in &def.inputs {
            let Some(given) = raw.inputs.get(&spec.name) else {
                continue;
            };
            hasher.update(b"\0");
            hasher.update(spec.name.as_bytes());
            let input = match as_link(given) {
                Some((source, output)) => {
                    let node = position[source];
                    match planned[node].cache_key {
                        Some(key) => hasher.update(&key),
                        None => {
                            cacheable = false;
                            &mut hasher
                        }
                    };
                    hasher.update(&output.to_le_bytes());
                    PlanInput::Link {
                        node,
                        output: output as usize,
                    }
                }
                None => {
                    let value = literals
                        .remove(&(id.to_string(), spec.name.clone()))
                        .unwrap_or(Value::Json(given.clone()));
                    value.fingerprint(&mut hasher);
                    PlanInput::Literal(value)
                }
            };
            inputs.push((spec.name.clone(), input));
        }
        planned.push(PlannedNode {
            id: id.to_string(),
            class_type: def.class_type.clone(),
            inputs,
            output_node: def.output_node,
            cache_key: cacheable.then(|| *hasher.finalize().as_bytes()),
        });
    }
    Plan { nodes: planned }
}
