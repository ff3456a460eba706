//! The sizes of `claims` and `user` for the cost model ([`crate::base::cel::cost`]): the largest
//! each can be, priced when an expression is compiled, and those of the token or user at hand,
//! priced before an expression whose largest case could pass the per-call limit is evaluated.

use std::sync::{Arc, LazyLock};

use serde_json::{Map, Value};

use super::{CLAIMS, Scope, USER};
use crate::authn::User;
use crate::base::cel::{Size, Sizes};
use crate::base::wire::MAX_REQUEST_HEAD_BYTES;

/// The most bytes of JSON a token's claims can take: the token is a header's value, at most
/// [`MAX_REQUEST_HEAD_BYTES`], and its payload, base64url-encoded, takes four bytes of it for
/// every three of JSON (a token in a WebSocket subprotocol is encoded once more, so smaller).
pub(super) const MAX_CLAIMS_BYTES: usize = MAX_REQUEST_HEAD_BYTES / 4 * 3;

/// The fewest bytes one claim of a JSON object takes (`"":0,`): the most claims a token holds is
/// its size over this.
const MIN_CLAIM_BYTES: usize = 5;

/// A size nothing bounds: the user is mapped from the claims by expressions, which can make it
/// larger than the token (`claims.groups.map(g, claims.sub)`), and the proxy sets it no limit.
/// An expression whose cost grows with the user is thus priced on each user; one whose cost does
/// not (`user.username.startsWith('oidc:')`) is not. Finite, so that the model's products stay
/// numbers: 10¹² squared is far below what overflows.
const UNBOUNDED: f64 = 1e12;

/// The largest value the variable of `scope` can have.
pub(super) fn worst_case(scope: Scope) -> &'static Sizes {
    static CLAIMS_WORST_CASE: LazyLock<Sizes> = LazyLock::new(|| {
        let bytes = MAX_CLAIMS_BYTES as f64;
        // Any claim (and any part of one) is as large as the whole payload.
        let claims = Size::Map {
            count: (MAX_CLAIMS_BYTES / MIN_CLAIM_BYTES) as f64,
            key: Box::new(Size::Unknown),
            key_total: None,
            value: Box::new(Size::Unknown),
        };
        Sizes::new(vec![(CLAIMS[0].name, claims)], bytes)
    });
    static USER_WORST_CASE: LazyLock<Sizes> = LazyLock::new(|| {
        let string = || Size::Str(UNBOUNDED);
        let strings = || Size::List {
            count: UNBOUNDED,
            elem: Box::new(string()),
            total: Some(UNBOUNDED),
        };
        let extra = Size::Map {
            count: UNBOUNDED,
            key: Box::new(string()),
            key_total: Some(UNBOUNDED),
            value: Box::new(strings()),
        };
        let user = user_record(string(), string(), strings(), extra);
        Sizes::new(vec![(USER[0].name, user)], UNBOUNDED)
    });
    match scope {
        Scope::Claims => &CLAIMS_WORST_CASE,
        Scope::User => &USER_WORST_CASE,
    }
}

/// The sizes of a token's claims: each claim's own, object by object.
pub(super) fn claims(claims: &Map<String, Value>) -> Sizes {
    let mut ceiling = 0.0;
    let claims = entries(claims, &mut ceiling);
    Sizes::new(vec![(CLAIMS[0].name, claims)], ceiling)
}

/// A JSON object's entries' sizes, adding each key's length and each value's to `ceiling`.
fn entries(object: &Map<String, Value>, ceiling: &mut f64) -> Size {
    let entries: Vec<(String, Size)> = object
        .iter()
        .map(|(key, value)| {
            *ceiling += key.len() as f64;
            (key.clone(), json(value, ceiling))
        })
        .collect();
    Size::Entries(Arc::from(entries))
}

/// A JSON value's size, adding its bytes (a string's length, one for anything else) to
/// `ceiling`: no value computed from the claims that the model cannot follow is larger than all
/// of them. The recursion is as deep as the JSON, which serde_json parses at most 128 levels
/// deep.
fn json(value: &Value, ceiling: &mut f64) -> Size {
    *ceiling += 1.0;
    match value {
        Value::String(s) => {
            *ceiling += s.len() as f64;
            Size::Str(s.len() as f64)
        }
        Value::Array(items) => {
            let strings: Option<usize> = items.iter().map(|item| item.as_str().map(str::len)).sum();
            let elem = items
                .iter()
                .map(|item| json(item, ceiling))
                .reduce(Size::max)
                .unwrap_or(Size::Str(0.0));
            Size::List {
                count: items.len() as f64,
                elem: Box::new(elem),
                total: strings.map(|total| total as f64),
            }
        }
        Value::Object(object) => entries(object, ceiling),
        Value::Null | Value::Bool(_) | Value::Number(_) => Size::Scalar,
    }
}

/// The sizes of `user`'s fields.
pub(super) fn user(user: &User) -> Sizes {
    let groups_total: usize = user.groups.iter().map(String::len).sum();
    let longest_group = user.groups.iter().map(String::len).max().unwrap_or(0);
    let groups = Size::list_of_strings(user.groups.len(), longest_group, groups_total);
    let key_total: usize = user.extra.keys().map(String::len).sum();
    let longest_key = user.extra.keys().map(String::len).max().unwrap_or(0);
    let mut values_total = 0;
    let value = user
        .extra
        .values()
        .map(|values| {
            let total: usize = values.iter().map(String::len).sum();
            values_total += total + values.len();
            let longest = values.iter().map(String::len).max().unwrap_or(0);
            Size::list_of_strings(values.len(), longest, total)
        })
        .fold(Size::list_of_strings(0, 0, 0), Size::max);
    let extra = Size::Map {
        count: user.extra.len() as f64,
        key: Box::new(Size::Str(longest_key as f64)),
        key_total: Some(key_total as f64),
        value: Box::new(value),
    };
    let ceiling = user.name.len()
        + user.uid.len()
        + groups_total
        + user.groups.len()
        + key_total
        + values_total;
    let user = user_record(
        Size::Str(user.name.len() as f64),
        Size::Str(user.uid.len() as f64),
        groups,
        extra,
    );
    Sizes::new(vec![(USER[0].name, user)], ceiling as f64)
}

/// `user` as a record of its fields' sizes.
fn user_record(username: Size, uid: Size, groups: Size, extra: Size) -> Size {
    Size::Record(Arc::from([
        ("username", username),
        ("uid", uid),
        ("groups", groups),
        ("extra", extra),
    ]))
}
