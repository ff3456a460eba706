//! Claims mapped by name, read as Go's `encoding/json` reads them.

use super::*;

fn mapper(username: &str, prefix: &str, groups: Option<(&str, &str)>) -> Mapper {
    Mapper {
        username: PrefixedMapping::Claim {
            claim: username.to_owned(),
            prefix: prefix.to_owned(),
        },
        groups: match groups {
            Some((claim, prefix)) => PrefixedMapping::Claim {
                claim: claim.to_owned(),
                prefix: prefix.to_owned(),
            },
            None => PrefixedMapping::None,
        },
        uid: UidMapping::None,
        extra: Vec::new(),
        required_claims: Vec::new(),
        claim_rules: Vec::new(),
        user_rules: Vec::new(),
    }
}

fn claims(json: &str) -> Map<String, Value> {
    serde_json::from_str(json).unwrap()
}

fn user(mapper: &Mapper, json: &str) -> Result<User, String> {
    mapper.user(&claims(json)).map_err(|e| e.to_string())
}

#[test]
fn the_user_name_is_the_claim_with_its_prefix() {
    let oidc = mapper("sub", "oidc:", None);
    assert_eq!(
        user(&oidc, r#"{"sub":"alice"}"#).unwrap().name,
        "oidc:alice"
    );
    // Go reads null into a string as the empty string.
    assert_eq!(user(&oidc, r#"{"sub":null}"#).unwrap().name, "oidc:");
    assert_eq!(
        user(&oidc, r#"{"name":"alice"}"#).unwrap_err(),
        "parse username claim \"sub\": claim not present"
    );
    assert_eq!(
        user(&oidc, r#"{"sub":7}"#).unwrap_err(),
        "parse username claim \"sub\": not a string"
    );
}

#[test]
fn an_email_user_name_needs_email_verified_true_when_present() {
    let email = mapper("email", "", None);
    assert_eq!(user(&email, r#"{"email":"a@x"}"#).unwrap().name, "a@x");
    assert_eq!(
        user(&email, r#"{"email":"a@x","email_verified":true}"#)
            .unwrap()
            .name,
        "a@x"
    );
    for unverified in ["false", "null"] {
        assert_eq!(
            user(
                &email,
                &format!(r#"{{"email":"a@x","email_verified":{unverified}}}"#)
            )
            .unwrap_err(),
            "email not verified"
        );
    }
    assert!(user(&email, r#"{"email":"a@x","email_verified":"true"}"#).is_err());
    // Another claim never looks at email_verified.
    let sub = mapper("sub", "", None);
    assert_eq!(
        user(&sub, r#"{"sub":"a","email_verified":false}"#)
            .unwrap()
            .name,
        "a"
    );
}

#[test]
fn groups_are_a_string_or_a_list_each_prefixed() {
    let groups = mapper("sub", "", Some(("groups", "oidc:")));
    let of = |json: &str| user(&groups, json).map(|u| u.groups);
    assert_eq!(
        of(r#"{"sub":"a","groups":["x","y"]}"#).unwrap(),
        ["oidc:x", "oidc:y"]
    );
    assert_eq!(
        of(r#"{"sub":"a","groups":"admins"}"#).unwrap(),
        ["oidc:admins"]
    );
    assert!(of(r#"{"sub":"a"}"#).unwrap().is_empty(), "absent: no group");
    assert!(of(r#"{"sub":"a","groups":null}"#).unwrap().is_empty());
    assert_eq!(
        of(r#"{"sub":"a","groups":["x",null]}"#).unwrap(),
        ["oidc:x", "oidc:"]
    );
    assert!(of(r#"{"sub":"a","groups":["x",1]}"#).is_err());
    assert!(of(r#"{"sub":"a","groups":{"x":1}}"#).is_err());
    let bare = mapper("sub", "", Some(("groups", "")));
    assert_eq!(
        user(&bare, r#"{"sub":"a","groups":["x"]}"#).unwrap().groups,
        ["x"]
    );
}

#[test]
fn the_uid_claim_must_be_present() {
    let mut with_uid = mapper("sub", "", None);
    with_uid.uid = UidMapping::Claim("oid".to_owned());
    assert_eq!(
        user(&with_uid, r#"{"sub":"a","oid":"u-1"}"#).unwrap().uid,
        "u-1"
    );
    assert_eq!(
        user(&with_uid, r#"{"sub":"a"}"#).unwrap_err(),
        "parse uid claim \"oid\": claim not present"
    );
}

#[test]
fn a_string_jti_is_the_credential_id() {
    let plain = mapper("sub", "", None);
    let extra = user(&plain, r#"{"sub":"a","jti":"id-1"}"#).unwrap().extra;
    assert_eq!(extra[CREDENTIAL_ID_EXTRA], ["JTI=id-1"]);
    assert!(
        user(&plain, r#"{"sub":"a","jti":5}"#)
            .unwrap()
            .extra
            .is_empty()
    );
    assert!(user(&plain, r#"{"sub":"a"}"#).unwrap().extra.is_empty());
}

#[test]
fn required_claims_must_be_strings_of_their_value() {
    let mut required = mapper("sub", "", None);
    required.required_claims = vec![("hd".to_owned(), "example.com".to_owned())];
    assert!(user(&required, r#"{"sub":"a","hd":"example.com"}"#).is_ok());
    assert_eq!(
        user(&required, r#"{"sub":"a","hd":"other.com"}"#).unwrap_err(),
        "required claim hd value does not match"
    );
    assert_eq!(
        user(&required, r#"{"sub":"a"}"#).unwrap_err(),
        "parse required claim \"hd\": claim not present"
    );
    assert!(user(&required, r#"{"sub":"a","hd":["example.com"]}"#).is_err());
}

fn cel(expression: &str, returns: super::super::expressions::Returns) -> Expression {
    super::super::expressions::compile(
        expression,
        super::super::expressions::Scope::Claims,
        returns,
    )
    .unwrap()
}

fn expression_mapper() -> Mapper {
    use super::super::expressions::Returns::Any;
    Mapper {
        username: PrefixedMapping::Expression(cel("'ci:' + claims.repo", Any)),
        groups: PrefixedMapping::Expression(cel("claims.teams.map(t, 'team:' + t)", Any)),
        uid: UidMapping::Expression(cel("claims.sub", Any)),
        extra: vec![
            (
                "example.com/run".to_owned(),
                cel("string(int(claims.run))", Any),
            ),
            ("example.com/none".to_owned(), cel("''", Any)),
        ],
        required_claims: Vec::new(),
        claim_rules: vec![Rule {
            expression: cel(
                "claims.protected == true",
                super::super::expressions::Returns::Bool,
            ),
            message: "protected branches only".to_owned(),
        }],
        user_rules: vec![Rule {
            expression: super::super::expressions::compile(
                "!user.username.startsWith('system:')",
                super::super::expressions::Scope::User,
                super::super::expressions::Returns::Bool,
            )
            .unwrap(),
            message: "no system users".to_owned(),
        }],
    }
}

#[test]
fn expressions_map_every_field_and_rules_decide_in_order() {
    let mapper = expression_mapper();
    let user = user(
        &mapper,
        r#"{"repo":"web","teams":["a","","b"],"sub":"u-1","run":42,"protected":true}"#,
    )
    .unwrap();
    assert_eq!(user.name, "ci:web");
    assert_eq!(user.groups, ["team:a", "team:", "team:b"]);
    assert_eq!(user.uid, "u-1");
    assert_eq!(user.extra["example.com/run"], ["42"]);
    assert!(
        !user.extra.contains_key("example.com/none"),
        "empty: left out"
    );

    let refused = |json: &str| self::user(&mapper, json).unwrap_err();
    assert_eq!(
        refused(r#"{"repo":"web","teams":[],"sub":"u","run":1,"protected":false}"#),
        "error evaluating claim validation expression: validation expression \
         'claims.protected == true' failed: protected branches only"
    );
    // A missing claim is an evaluation error of the mapping that reads it.
    assert!(
        refused(r#"{"teams":[],"sub":"u","run":1,"protected":true}"#)
            .starts_with("error evaluating username claim expression:")
    );
    // Groups from a claim that is not a list: the expression fails, and the token with it.
    assert!(
        refused(r#"{"repo":"web","teams":"a","sub":"u","run":1,"protected":true}"#)
            .starts_with("error evaluating group claim expression:")
    );
}

#[test]
fn a_user_rule_sees_the_mapped_user() {
    use super::super::expressions::Returns::Any;
    let mut mapper = expression_mapper();
    mapper.username = PrefixedMapping::Expression(cel("claims.name", Any));
    let refused = user(
        &mapper,
        r#"{"name":"system:admin","teams":[],"sub":"u","run":1,"protected":true}"#,
    )
    .unwrap_err();
    assert_eq!(
        refused,
        "error evaluating user info validation rule: validation expression \
         '!user.username.startsWith('system:')' failed: no system users"
    );
    let empty = user(
        &mapper,
        r#"{"name":"","teams":[],"sub":"u","run":1,"protected":true}"#,
    )
    .unwrap_err();
    assert_eq!(empty, "empty username via CEL expression is not allowed");
}
