//! Holds node identities to their own node: a kubelet client certificate stolen from node A must
//! not open node B's kubelet API. Not kubelet behaviour (the kubelet judges node credentials by its
//! authorizer alone): an extension that refuses early and spares the other authorizers.

use std::sync::Arc;

use super::{Attributes, Decision, Reason};

/// The user-name prefix of node identities.
const NODE_USER_PREFIX: &str = "system:node:";
/// The group every node identity is in.
const NODES_GROUP: &str = "system:nodes";

/// The `Node` mode of `--authorization-mode`.
#[derive(Debug, Clone)]
pub struct NodeAuthorizer {
    /// The node this proxy guards (`--node-name`). Not taken from the attributes: the pod-level
    /// set names a pod, not the node.
    node_name: Arc<str>,
}

impl NodeAuthorizer {
    /// The authorizer for the node `node_name`.
    pub fn new(node_name: Arc<str>) -> NodeAuthorizer {
        NodeAuthorizer { node_name }
    }

    /// Denies a node identity (`system:node:<n>` in `system:nodes`) whose `<n>` is not the node
    /// this proxy guards, on every attribute set; has no opinion on everyone else, including this
    /// node's own identity, which later authorizers decide on.
    pub fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        let user = attrs.user;
        match user.name.strip_prefix(NODE_USER_PREFIX) {
            Some(node) if user.in_group(NODES_GROUP) => {
                if node == &*self.node_name {
                    Decision::NoOpinion(Reason::Static("node identity of this node"))
                } else {
                    Decision::Deny(Reason::Static(
                        "node identities may only access their own node's kubelet",
                    ))
                }
            }
            _ => Decision::NoOpinion(Reason::Static("not a node identity")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authn::User;

    fn decide(name: &str, groups: &[&str], node: &str) -> Decision {
        let user = User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..User::default()
        };
        let attributes = [
            Attributes {
                user: &user,
                verb: "get",
                namespace: "",
                resource: "nodes",
                subresource: "proxy",
                name: node,
                path: "/pods",
            },
            Attributes {
                user: &user,
                verb: "create",
                namespace: "team-a",
                resource: "pods",
                subresource: "exec",
                name: "web-0",
                path: "/exec/team-a/web-0/c",
            },
        ];
        let authorizer = NodeAuthorizer::new(node.into());
        let [node_set, pod_set] = attributes.map(|a| authorizer.authorize(&a));
        assert_eq!(
            node_set, pod_set,
            "{name}: the same answer on a pod-level set"
        );
        node_set
    }

    #[test]
    fn other_nodes_are_denied_own_node_and_others_pass() {
        assert!(matches!(
            decide("system:node:n2", &["system:nodes"], "n1"),
            Decision::Deny(_)
        ));
        assert!(matches!(
            decide("system:node:", &["system:nodes"], "n1"),
            Decision::Deny(_)
        ));
        assert!(matches!(
            decide("system:node:n1", &["system:nodes"], "n1"),
            Decision::NoOpinion(_)
        ));
        // Without the group it is not a node identity (kubernetes v1.33
        // `pkg/auth/nodeidentifier/default.go` `NodeIdentity`).
        assert!(matches!(
            decide("system:node:n2", &[], "n1"),
            Decision::NoOpinion(_)
        ));
        assert!(matches!(
            decide("alice", &["system:nodes"], "n1"),
            Decision::NoOpinion(_)
        ));
    }
}
