//! The TokenReview side of the stand-in API server: the users its tokens stand for, and
//! TokenReview's REST storage (validation, audiences, the `status` it fills).

use std::collections::BTreeMap;

use http::StatusCode;
use serde_json::{Map, Value, json};

use super::serve::{decode, status_json};
use super::{API_AUDIENCES, Shared, UNKNOWN_TOKEN_ERROR};

/// A user as TokenReview's `status.user` carries it, and the audiences its token is good for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenUser {
    /// `username`.
    pub username: String,
    /// `uid` (omitted when empty).
    pub uid: String,
    /// `groups`, in order.
    pub groups: Vec<String>,
    /// `extra`.
    pub extra: BTreeMap<String, Vec<String>>,
    /// Audiences the token was issued for; by default [`API_AUDIENCES`].
    pub audiences: Vec<String>,
}

impl TokenUser {
    /// `username`, with the groups the API server always adds (`system:authenticated`).
    pub fn new(username: &str) -> TokenUser {
        TokenUser {
            username: username.to_owned(),
            uid: String::new(),
            groups: vec!["system:authenticated".to_owned()],
            extra: BTreeMap::new(),
            audiences: API_AUDIENCES.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    /// Replaces the groups, exactly as given.
    pub fn groups(mut self, groups: &[&str]) -> TokenUser {
        self.groups = groups.iter().map(|g| (*g).to_owned()).collect();
        self
    }

    /// Sets the uid.
    pub fn uid(mut self, uid: &str) -> TokenUser {
        self.uid = uid.to_owned();
        self
    }

    /// Adds an extra value.
    pub fn extra(mut self, key: &str, values: &[&str]) -> TokenUser {
        self.extra.insert(
            key.to_owned(),
            values.iter().map(|v| (*v).to_owned()).collect(),
        );
        self
    }

    /// Sets the audiences the token is good for.
    pub fn audiences(mut self, audiences: &[&str]) -> TokenUser {
        self.audiences = audiences.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    fn user_json(&self) -> Value {
        let mut user = Map::new();
        user.insert("username".into(), json!(self.username));
        if !self.uid.is_empty() {
            user.insert("uid".into(), json!(self.uid));
        }
        if !self.groups.is_empty() {
            user.insert("groups".into(), json!(self.groups));
        }
        if !self.extra.is_empty() {
            user.insert("extra".into(), json!(self.extra));
        }
        Value::Object(user)
    }
}

/// What TokenReview says about one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TokenVerdict {
    Authenticated(TokenUser),
    Rejected { error: String },
}

/// TokenReview's REST storage: an empty token is a 400; the token is checked against the
/// requested audiences (the API audiences when none); the status says who it is.
pub(super) fn review_token(body: &[u8], shared: &Shared) -> (StatusCode, Value) {
    let review = match decode(body, "TokenReview", "authentication.k8s.io/v1") {
        Ok(review) => review,
        Err(error) => return error,
    };
    let spec = &review["spec"];
    let token = spec["token"].as_str().unwrap_or_default();
    let requested: Vec<String> = spec["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    let state = shared.lock();
    if token.is_empty() {
        return status_json(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "token is required for TokenReview in authentication",
            None,
        );
    }
    let wanted: Vec<String> = if requested.is_empty() {
        API_AUDIENCES.iter().map(|a| (*a).to_owned()).collect()
    } else {
        requested.clone()
    };
    let mut status = Map::new();
    let verdict = state.tokens.get(token).cloned().or_else(|| {
        state.token_rule.as_ref().map(|rule| match rule(token) {
            Ok(user) => TokenVerdict::Authenticated(user),
            Err(error) => TokenVerdict::Rejected { error },
        })
    });
    match &verdict {
        Some(TokenVerdict::Authenticated(user)) => {
            let audiences: Vec<&String> = user
                .audiences
                .iter()
                .filter(|a| wanted.contains(a))
                .collect();
            if audiences.is_empty() {
                status.insert("user".into(), json!({}));
                status.insert(
                    "error".into(),
                    json!(format!(
                        "[{UNKNOWN_TOKEN_ERROR}, token audiences {} is invalid for the target \
                         audiences {}]",
                        go_quoted(&user.audiences),
                        go_quoted(&wanted)
                    )),
                );
            } else {
                status.insert("authenticated".into(), json!(true));
                status.insert("user".into(), user.user_json());
                status.insert("audiences".into(), json!(audiences));
            }
        }
        Some(TokenVerdict::Rejected { error }) => {
            status.insert("user".into(), json!({}));
            if !error.is_empty() {
                status.insert("error".into(), json!(error));
            }
        }
        None => {
            status.insert("user".into(), json!({}));
            status.insert("error".into(), json!(UNKNOWN_TOKEN_ERROR));
        }
    }
    let mut echoed = Map::new();
    echoed.insert("token".into(), json!(token));
    if !requested.is_empty() {
        echoed.insert("audiences".into(), json!(requested));
    }
    (
        StatusCode::CREATED,
        json!({
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": echoed,
            "status": status,
        }),
    )
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}
