//! Aggregated ClusterRoles (`aggregationRule`), filled in as kube-controller-manager's
//! clusterrole-aggregation controller does (kubernetes v1.36
//! `pkg/controller/clusterroleaggregation/clusterroleaggregation_controller.go`): for each
//! selector in order, the ClusterRoles it selects sorted by name, the role itself left out, their
//! rules appended unless an equal rule is already there.
//!
//! A dump of a live cluster already carries the rules the controller wrote, and RBAC only ever
//! reads `rules`: those are used as they are. Only an aggregated role whose `rules` are empty or
//! `null` (a hand-written file, or a dump of the bootstrap policy before the controller ran) is
//! filled in here, from the ClusterRoles of all loaded files.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

use crate::authz::rbac::PolicyRule;

/// A ClusterRole's `aggregationRule`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct AggregationRule {
    /// Roles matching any selector contribute their rules.
    #[serde(default)]
    pub(super) cluster_role_selectors: Vec<LabelSelector>,
}

/// A `metav1.LabelSelector`: every `matchLabels` pair and every `matchExpressions` requirement
/// must hold; an empty selector selects every ClusterRole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
    #[serde(default)]
    match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Requirement {
    #[serde(default)]
    key: String,
    #[serde(default)]
    operator: String,
    #[serde(default)]
    values: Vec<String>,
}

impl AggregationRule {
    /// The rule of a watched ClusterRole.
    pub(super) fn new(cluster_role_selectors: Vec<LabelSelector>) -> AggregationRule {
        AggregationRule {
            cluster_role_selectors,
        }
    }
}

impl LabelSelector {
    /// A selector as the API server serves it (already validated there): `matchLabels`, and
    /// each `matchExpressions` entry as (key, operator, values).
    pub fn new(
        match_labels: BTreeMap<String, String>,
        match_expressions: impl IntoIterator<Item = (String, String, Vec<String>)>,
    ) -> LabelSelector {
        LabelSelector {
            match_labels,
            match_expressions: match_expressions
                .into_iter()
                .map(|(key, operator, values)| Requirement {
                    key,
                    operator,
                    values,
                })
                .collect(),
        }
    }

    /// What `metav1.LabelSelectorAsSelector` would refuse in this selector, in its words: the
    /// controller cannot aggregate through such a selector, so the file is refused.
    pub(super) fn problem(&self) -> Option<String> {
        if self.match_labels.keys().any(String::is_empty) {
            return Some("matchLabels: a label key is empty".to_owned());
        }
        for (index, requirement) in self.match_expressions.iter().enumerate() {
            let at = format!("matchExpressions[{index}]");
            if requirement.key.is_empty() {
                return Some(format!("{at}: key is empty"));
            }
            match requirement.operator.as_str() {
                "In" | "NotIn" if requirement.values.is_empty() => {
                    return Some(format!(
                        "{at}: for 'In', 'NotIn' operators, values set can't be empty"
                    ));
                }
                "Exists" | "DoesNotExist" if !requirement.values.is_empty() => {
                    return Some(format!(
                        "{at}: values set must be empty for exists and does not exist"
                    ));
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => {
                    return Some(format!(
                        "{at}: {other:?} is not a valid label selector operator (In, NotIn, \
                         Exists, DoesNotExist)"
                    ));
                }
            }
        }
        None
    }

    /// Whether a role with `labels` is selected.
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    // Refused at load by `problem`.
                    _ => false,
                }
            })
    }
}

/// What aggregation reads and writes of one ClusterRole.
#[derive(Debug)]
pub(super) struct AggregationInput<'a> {
    /// `metadata.name`.
    pub(super) name: &'a str,
    /// `metadata.labels`.
    pub(super) labels: &'a BTreeMap<String, String>,
    /// The selectors of a role to fill in, `None` for every other role.
    pub(super) fill_from: Option<&'a [LabelSelector]>,
}

/// Fills in `rules[i]` for every role `i` with `fill_from`, from the rules of the roles its
/// selectors pick. Aggregated roles can select each other (`admin` selects `edit`, which
/// selects `view`): as the controller, which re-runs on every change, this repeats until nothing
/// changes. Each round can only add rules, so it ends; the bound on rounds is a backstop.
pub(super) fn aggregate(roles: &[AggregationInput<'_>], rules: &mut [Vec<PolicyRule>]) {
    let mut by_name: Vec<usize> = (0..roles.len()).collect();
    by_name.sort_by(|&a, &b| roles[a].name.cmp(roles[b].name));
    let targets: Vec<(usize, &[LabelSelector])> = roles
        .iter()
        .enumerate()
        .filter_map(|(i, role)| role.fill_from.map(|selectors| (i, selectors)))
        .collect();
    for _round in 0..=roles.len() {
        let mut changed = false;
        for &(target, selectors) in &targets {
            let mut filled: Vec<PolicyRule> = Vec::new();
            let mut seen: HashSet<&PolicyRule> = HashSet::new();
            for selector in selectors {
                for &source in &by_name {
                    if source == target || !selector.matches(roles[source].labels) {
                        continue;
                    }
                    for rule in &rules[source] {
                        if seen.insert(rule) {
                            filled.push(rule.clone());
                        }
                    }
                }
            }
            drop(seen);
            if filled != rules[target] {
                rules[target] = filled;
                changed = true;
            }
        }
        if !changed {
            return;
        }
    }
}
