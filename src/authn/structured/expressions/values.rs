//! The CEL values of `claims` and `user` as kube-apiserver v1.36 builds them
//! (`plugin/pkg/authenticator/token/oidc/oidc.go` `newClaimsValue`, `newUserInfoValue`,
//! `unescapeWrapper`; `pkg/cel/lazy/lazy.go` `MapValue`), borrowing the token's claims and the
//! user rather than copying them:
//!
//! - the variable itself is a record of its fields ([`Fields`], kube-apiserver's `lazy.MapValue`):
//!   a field is looked up under the name Kubernetes' escaping makes of it
//!   (`claims.kubernetes__dot__io` is the claim `kubernetes.io`; a name that is not a valid
//!   escape finds nothing), `in` looks up the same way, and iterating it yields its fields'
//!   *values*, as kube-apiserver's iterator does;
//! - a JSON object in the claims, and the user's `extra`, is a map whose `.key` and `['key']`
//!   look up what the key unescapes to when that is a valid escape and differs, the key as
//!   written otherwise ([`EscapedMap`], kube-apiserver's `unescapeMapper`); `in` and iterating
//!   take keys as they are;
//! - every JSON number is a `double` (kube-apiserver decodes each claim with Go's
//!   `encoding/json` into `any`), strings, bools and null are themselves, arrays are lists.

use std::collections::HashMap;
use std::collections::hash_map;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use cel::ExecutionError;
use cel::common::traits::{self, Container, Indexer, Iterable, Sizer, Zeroer};
use cel::common::types::{
    self, CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, Type,
};
use cel::common::value::{CowVal, Val};
use serde_json::{Map, Value};

use crate::authn::User;
use crate::base::cel::{string_list, unescape};

/// The CEL type of a top-level variable.
pub(super) trait Named: Debug + Send + Sync + 'static {
    /// Its type.
    fn cel_type() -> &'static Type;
}

/// `claims`: of type `map`, so that `size(claims)` finds the standard library's overload, as
/// kube-apiserver's checker finds it for the declared `map(string, dyn)` (its value's own type is
/// named `kubernetes.claims`).
#[derive(Debug)]
pub(super) enum Claims {}

impl Named for Claims {
    fn cel_type() -> &'static Type {
        &types::MAP_TYPE
    }
}

/// `user`: of type `kubernetes.UserInfo`.
#[derive(Debug)]
pub(super) enum UserInfo {}

/// The type of `user`'s value.
static USER_INFO: Type = Type::new_unspecified_type("kubernetes.UserInfo");

impl Named for UserInfo {
    fn cel_type() -> &'static Type {
        &USER_INFO
    }
}

/// A top-level variable: its fields by name, each converted once, when the input is built.
#[derive(Debug)]
pub(super) struct Fields<'a, N: Named> {
    fields: HashMap<&'a str, Box<dyn Val + 'a>>,
    named: PhantomData<N>,
}

impl<N: Named> Clone for Fields<'_, N> {
    fn clone(&self) -> Self {
        Fields {
            fields: self.fields.clone(),
            named: PhantomData,
        }
    }
}

impl<'a, N: Named> Fields<'a, N> {
    fn new(fields: HashMap<&'a str, Box<dyn Val + 'a>>) -> Self {
        Fields {
            fields,
            named: PhantomData,
        }
    }

    /// The field `key` names once unescaped: `None` when `key` is not a string (an error), no
    /// field when its escape is invalid or nothing has that name.
    fn find(&self, key: &dyn Val) -> Option<Option<&(dyn Val + 'a)>> {
        let key = key.downcast_ref::<CelString>()?;
        let name = unescape(key.inner());
        Some(name.and_then(|name| self.fields.get(name.as_ref()).map(|v| v.as_ref())))
    }
}

/// A key that is not a string, which kube-apiserver's lookups refuse.
fn not_a_name(key: &dyn Val) -> ExecutionError {
    ExecutionError::UnexpectedType {
        got: key.get_type().name().to_owned(),
        want: "string".to_owned(),
    }
}

/// A key that finds nothing, named as written.
fn no_such_key(key: &dyn Val) -> ExecutionError {
    let name = key
        .downcast_ref::<CelString>()
        .map_or_else(String::new, |k| k.inner().to_owned());
    ExecutionError::NoSuchKey(Arc::new(name))
}

impl<N: Named> Val for Fields<'_, N> {
    fn get_type(&self) -> &Type {
        N::cel_type()
    }

    fn cel_type() -> &'static Type {
        N::cel_type()
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    /// kube-apiserver's `lazy.MapValue` equals only itself.
    fn equals(&self, other: &dyn Val) -> bool {
        std::ptr::addr_eq(self, other)
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(self.clone())
    }
}

impl<N: Named> Indexer for Fields<'_, N> {
    fn get<'b, 'w>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        match self.find(key) {
            None => Err(not_a_name(key)),
            Some(None) => Err(no_such_key(key)),
            Some(Some(value)) => Ok(CowVal::Borrowed(value)),
        }
    }

    fn steal<'w>(self: Box<Self>, key: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(key).map(CowVal::into_owned)
    }
}

impl<N: Named> Container for Fields<'_, N> {
    fn contains(&self, key: &dyn Val) -> Result<bool, ExecutionError> {
        match self.find(key) {
            None => Err(not_a_name(key)),
            Some(found) => Ok(found.is_some()),
        }
    }
}

/// Iterating a top-level variable yields its fields' values: kube-apiserver's `lazy.MapValue`
/// iterator returns `Get(name)` for each name, not the name.
impl<N: Named> Iterable for Fields<'_, N> {
    fn iter<'b, 'w>(&'b self) -> Box<dyn traits::Iterator<'b, 'w> + 'b>
    where
        Self: 'w,
    {
        Box::new(Values(self.fields.values()))
    }
}

/// The values of a [`Fields`], lent one by one.
struct Values<'b, 'a>(hash_map::Values<'b, &'a str, Box<dyn Val + 'a>>);

impl<'b, 'a: 'w, 'w> traits::Iterator<'b, 'w> for Values<'b, 'a> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'w)> {
        self.0
            .next()
            .map(|value| value.as_ref() as &'b (dyn Val + 'w))
    }
}

impl<N: Named> Sizer for Fields<'_, N> {
    fn size(&self) -> CelInt {
        CelInt::from(self.fields.len() as i64)
    }
}

/// A map whose lookups read Kubernetes' escapes: a JSON object of the claims, the user's extra.
#[derive(Debug, Clone)]
pub(super) struct EscapedMap<'a>(CelMap<'a>);

impl<'a> EscapedMap<'a> {
    /// The value at `key` as this map looks it up: at what `key` unescapes to when that is valid
    /// and differs, else at `key` itself.
    fn lookup<'b, 'w>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        'a: 'w,
    {
        let unescaped = key
            .downcast_ref::<CelString>()
            .and_then(|k| unescape(k.inner()).filter(|name| name.as_ref() != k.inner()));
        match unescaped {
            Some(name) => {
                Indexer::get(&self.0, &CelString::from(name.as_ref())).map_err(|_| no_such_key(key))
            }
            None => Indexer::get(&self.0, key),
        }
    }
}

impl Val for EscapedMap<'_> {
    fn get_type(&self) -> &Type {
        &types::MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &types::MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(&self.0)
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        Some(&self.0)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(&self.0)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(&self.0)
    }

    /// Equal to a map of the same size in which each of its keys finds an equal value, as
    /// kube-apiserver compares its wrapped maps (the other map's lookup, escapes read, finds the
    /// value). A map on the left of `==` compares with its own rule, which knows only its own
    /// kind: there a literal map never equals one of the claims.
    fn equals(&self, other: &dyn Val) -> bool {
        let (Some(sizer), Some(indexer)) = (other.as_sizer(), other.as_indexer()) else {
            return false;
        };
        other.get_type() == self.get_type()
            && sizer.size() == self.0.size()
            && self.0.inner().iter().all(|(key, value)| {
                indexer
                    .get(key.inner())
                    .is_ok_and(|found| value.equals(found.as_ref()))
            })
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(self.clone())
    }
}

impl Indexer for EscapedMap<'_> {
    fn get<'b, 'w>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.lookup(key)
    }

    fn steal<'w>(self: Box<Self>, key: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.lookup(key).map(CowVal::into_owned)
    }
}

/// `claims`: each claim of the token's payload, converted once.
pub(super) fn claims(claims: &Map<String, Value>) -> Fields<'_, Claims> {
    Fields::new(claims.iter().map(|(k, v)| (k.as_str(), json(v))).collect())
}

/// A JSON value as CEL, borrowing its strings. The recursion is as deep as the JSON, which
/// serde_json parses at most 128 levels deep.
fn json(value: &Value) -> Box<dyn Val + '_> {
    match value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        // Some for every number serde_json holds without its `arbitrary_precision` feature,
        // which nothing here enables.
        Value::Number(n) => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(items) => Box::new(CelList::from(items.iter().map(json).collect::<Vec<_>>())),
        Value::Object(entries) => {
            let entries: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = entries
                .iter()
                .map(|(k, v)| (CelMapKey::from(k.as_str()), json(v)))
                .collect();
            Box::new(EscapedMap(CelMap::from(entries)))
        }
    }
}

/// `user`: its four fields always there, empty when the user has none.
pub(super) fn user(user: &User) -> Fields<'_, UserInfo> {
    let extra: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = user
        .extra
        .iter()
        .map(|(key, values)| (CelMapKey::from(key.as_str()), string_list(values)))
        .collect();
    let fields: [(&str, Box<dyn Val + '_>); 4] = [
        ("username", Box::new(CelString::from(user.name.as_str()))),
        ("uid", Box::new(CelString::from(user.uid.as_str()))),
        ("groups", string_list(&user.groups)),
        ("extra", Box::new(EscapedMap(CelMap::from(extra)))),
    ];
    Fields::new(fields.into_iter().collect())
}
