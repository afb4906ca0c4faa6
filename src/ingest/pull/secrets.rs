//! The secrets of a pull: read from the environment variable or file the contract names, held
//! in a type that never prints them, and every text a pull shows passed through [`Redactor`].
//!
//! A secret's value reaches only the request that needs it: never the lake, the run log, the
//! failure log, an error message or a printed URL (docs/security.md#api-secrets).

use std::fmt;

use crate::error::{Error, Result};
use crate::spec::contract::api::{Auth, SecretFrom, SecretRef};

/// A secret value. `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret a server gave (an OAuth2 access token).
    pub(crate) fn from_token(s: String) -> Secret {
        Secret(s)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Read one secret. A missing variable, an unreadable or empty file fails the run for its
/// content (the contract's setting is what to fix), naming the contract key and the variable or
/// file, never a value. A file's last line end is not part of the secret.
pub fn read(source: &str, r: &SecretRef) -> Result<Secret> {
    let value = match &r.from {
        SecretFrom::Env(name) => match std::env::var(name) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => {
                return Err(Error::RunFailed(format!(
                    "{source}: {} names the environment variable {name}, which is not set; set it to the \
                     secret and pull again",
                    r.key
                )));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(Error::RunFailed(format!(
                    "{source}: the environment variable {name} ({}) is not valid UTF-8",
                    r.key
                )));
            }
        },
        SecretFrom::File(path) => match std::fs::read_to_string(path) {
            Ok(text) => {
                let t = text.strip_suffix('\n').unwrap_or(&text);
                t.strip_suffix('\r').unwrap_or(t).to_string()
            }
            Err(e) => {
                return Err(Error::RunFailed(format!(
                    "{source}: {} names the file {}, which cannot be read ({}); nothing was pulled",
                    r.key,
                    path.display(),
                    e.kind()
                )));
            }
        },
    };
    if value.is_empty() {
        let from = match &r.from {
            SecretFrom::Env(name) => format!("the environment variable {name}"),
            SecretFrom::File(path) => format!("the file {}", path.display()),
        };
        return Err(Error::RunFailed(format!("{source}: {} ({from}) is empty", r.key)));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(Error::RunFailed(format!(
            "{source}: the secret of {} holds a control character (a line end inside a token?)",
            r.key
        )));
    }
    Ok(Secret(value))
}

/// The secrets of an `auth` section, read.
#[derive(Debug, Clone)]
pub enum Credentials {
    None,
    Bearer(Secret),
    ApiKeyHeader {
        name: String,
        key: Secret,
    },
    ApiKeyQuery {
        name: String,
        key: Secret,
    },
    Basic {
        username: Secret,
        password: Secret,
    },
    OAuth2 {
        token_url: url::Url,
        client_id: Secret,
        client_secret: Secret,
        scope: Option<String>,
    },
}

impl Credentials {
    pub fn read(source: &str, auth: &Auth) -> Result<Credentials> {
        use crate::spec::contract::api::KeyAt;
        Ok(match auth {
            Auth::None => Credentials::None,
            Auth::Bearer { token } => Credentials::Bearer(read(source, token)?),
            Auth::ApiKey {
                at: KeyAt::Header,
                name,
                key,
            } => Credentials::ApiKeyHeader {
                name: name.clone(),
                key: read(source, key)?,
            },
            Auth::ApiKey {
                at: KeyAt::Query,
                name,
                key,
            } => Credentials::ApiKeyQuery {
                name: name.clone(),
                key: read(source, key)?,
            },
            Auth::Basic { username, password } => Credentials::Basic {
                username: read(source, username)?,
                password: read(source, password)?,
            },
            Auth::OAuth2ClientCredentials {
                token_url,
                client_id,
                client_secret,
                scope,
            } => Credentials::OAuth2 {
                token_url: token_url.clone(),
                client_id: read(source, client_id)?,
                client_secret: read(source, client_secret)?,
                scope: scope.clone(),
            },
        })
    }

    /// The secret values, for the [`Redactor`].
    fn values(&self) -> Vec<String> {
        match self {
            Credentials::None => vec![],
            Credentials::Bearer(s) => vec![s.0.clone()],
            Credentials::ApiKeyHeader { key, .. } | Credentials::ApiKeyQuery { key, .. } => vec![key.0.clone()],
            // and the header that carries both, which a server may echo back
            Credentials::Basic { username, password } => {
                vec![username.0.clone(), password.0.clone(), basic_pair(username, password)]
            }
            Credentials::OAuth2 {
                client_id,
                client_secret,
                ..
            } => vec![
                client_id.0.clone(),
                client_secret.0.clone(),
                basic_pair(client_id, client_secret),
            ],
        }
    }

    /// The query parameter that carries a key (`api_key` with `in: query`).
    pub fn query_key(&self) -> Option<&str> {
        match self {
            Credentials::ApiKeyQuery { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// `user:password` as HTTP Basic sends it (RFC 7617): base64, without the `Basic ` in front.
fn basic_pair(user: &Secret, password: &Secret) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", user.0, password.0))
}

/// Removes secrets from every text a pull shows: each secret's value (and its form as a URL
/// encodes it) becomes `***`, and so does the value of the query parameter that carries a key.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    values: Vec<String>,
    query_key: Option<String>,
}

impl Redactor {
    pub fn new(credentials: &Credentials) -> Redactor {
        let mut r = Redactor {
            values: Vec::new(),
            query_key: credentials.query_key().map(str::to_string),
        };
        for v in credentials.values() {
            r.add(&v);
        }
        r
    }

    /// Also redact `value` (an OAuth2 access token once fetched).
    pub fn add(&mut self, value: &str) {
        // a very short secret would blank out ordinary words: it is still never printed by
        // ingot, but only values of 4 characters or more are searched for in other texts
        if value.len() < 4 {
            return;
        }
        let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        for v in [value.to_string(), encoded] {
            if !self.values.contains(&v) {
                self.values.push(v);
            }
        }
        // longest first, so a secret that contains another is replaced whole
        self.values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    }

    /// `text` with every secret replaced by `***`.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "***");
            }
        }
        out
    }

    /// A URL as it may be shown: the key parameter's value and any secret replaced, and user
    /// information dropped.
    pub fn url(&self, url: &url::Url) -> String {
        let mut u = url.clone();
        let _ = u.set_username("");
        let _ = u.set_password(None);
        if let Some(key) = &self.query_key
            && u.query_pairs().any(|(k, _)| k == key.as_str())
        {
            let pairs: Vec<(String, String)> = u
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k == key.as_str() {
                        "***".to_string()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            u.query_pairs_mut().clear().extend_pairs(pairs);
        }
        // `***` as the serializer writes it back is `%2A%2A%2A`: shown as written
        self.text(u.as_ref()).replace("%2A%2A%2A", "***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print_and_redaction_covers_encoded_forms_and_the_key_parameter() {
        let s = Secret("s3cr3t/+=value".into());
        assert_eq!(format!("{s} {s:?}"), "*** ***");
        let creds = Credentials::ApiKeyQuery {
            name: "api_key".into(),
            key: s,
        };
        let r = Redactor::new(&creds);
        let u = url::Url::parse("https://u:p@vendor.example/v2/orders?api_key=abc&page=2")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.url(&u), "https://vendor.example/v2/orders?api_key=***&page=2");
        assert_eq!(
            r.text("token s3cr3t/+=value and s3cr3t%2F%2B%3Dvalue"),
            "token *** and ***"
        );
        let basic = Credentials::Basic {
            username: Secret("svc".into()),
            password: Secret("open sesame".into()),
        };
        assert_eq!(
            Redactor::new(&basic).text("got: Basic c3ZjOm9wZW4gc2VzYW1l"),
            "got: Basic ***",
            "the header a server echoes"
        );
        let mut r = Redactor::default();
        r.add("abc");
        assert_eq!(r.text("abc"), "abc", "short values are not searched for");
    }
}
