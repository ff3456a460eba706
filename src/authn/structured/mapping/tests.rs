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
