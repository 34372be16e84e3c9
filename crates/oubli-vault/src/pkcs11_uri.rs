//! A strict parser for RFC 7512 PKCS#11 URIs (`pkcs11:token=...;object=...?module-path=...&pin-value=...`).
//!
//! Strict on purpose: a vault location that is silently misread (a typo in
//! an attribute name ignored, a duplicate taking the last value) could open
//! the wrong token or write the epoch key where the user did not mean it. So
//! unknown standard attributes, duplicates, malformed percent-escapes,
//! characters RFC 7512 requires to be escaped, and non-UTF-8 labels are all
//! errors. Vendor attributes (`x-...`) are accepted and ignored, as the RFC
//! reserves them for extensions.

use oubli_core::VaultError;
use oubli_crypto::SecretBytes;
use std::path::PathBuf;

/// A parsed `pkcs11:` URI. Only the attributes oubli uses are kept; the PIN
/// is a secret and is never printed (see [`Pkcs11Uri::redacted`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Pkcs11Uri {
    /// `token=`: the token's label.
    pub token: Option<String>,
    /// `manufacturer=`: the token's manufacturer id.
    pub manufacturer: Option<String>,
    /// `serial=`: the token's serial number.
    pub serial: Option<String>,
    /// `model=`: the token's model.
    pub model: Option<String>,
    /// `slot-id=`: the slot's numeric id.
    pub slot_id: Option<u64>,
    /// `object=`: the label of the vault's data objects.
    pub object: Option<String>,
    /// `type=`: must be `data` if given (the vault stores data objects).
    pub object_type: Option<String>,
    /// `module-path=`: the PKCS#11 module to load.
    pub module_path: Option<PathBuf>,
    /// `module-name=`: a module name, looked up in the usual directories.
    pub module_name: Option<String>,
    /// `pin-value=`: the user PIN, in the URI itself (RFC 7512 §2.3).
    pub pin_value: Option<SecretBytes>,
}

impl std::fmt::Debug for Pkcs11Uri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

fn bad(uri: &str, why: impl std::fmt::Display) -> VaultError {
    // The URI may hold a PIN: never echo it back. The query (where RFC 7512
    // puts pin-value) is dropped; a pin-value misplaced in the path is
    // masked too.
    let path = uri.split('?').next().unwrap_or("");
    let shown: Vec<String> = path
        .split(';')
        .map(|attr| match attr.split_once('=') {
            Some((name, _))
                if name
                    .trim_start_matches("pkcs11:")
                    .eq_ignore_ascii_case("pin-value") =>
            {
                format!("{name}=(hidden)")
            }
            _ => attr.to_string(),
        })
        .collect();
    let shown = shown.join(";");
    VaultError::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("bad PKCS#11 URI `{shown}...`: {why}"),
    ))
}

/// Characters RFC 7512 allows unescaped in a path attribute value
/// (unreserved, and pk11-path-res-avail: ":" "[" "]" "@" "!" "$" "'" "(" ")"
/// "*" "+" "," "=" "&").
fn path_char_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-._~:[]@!$'()*+,=&".contains(&c)
}

/// Characters allowed unescaped in a query attribute value (pk11-qchar:
/// unreserved, ":" "[" "]" "@" "!" "$" "'" "(" ")" "*" "+" "," "=" ";"
/// "/" "?" "|").
fn query_char_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-._~:[]@!$'()*+,=;/?|".contains(&c)
}

/// Decodes `%XX` escapes; any other character must pass `ok`.
fn percent_decode(value: &str, ok: fn(u8) -> bool) -> Result<Vec<u8>, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .ok_or_else(|| format!("bad percent-escape at byte {i}"))?;
            out.push(u8::from_str_radix(hex, 16).expect("checked hex"));
            i += 3;
        } else if ok(c) {
            out.push(c);
            i += 1;
        } else {
            return Err(format!(
                "character {:?} must be percent-encoded",
                char::from(c)
            ));
        }
    }
    Ok(out)
}

fn percent_encode(value: &[u8], ok: fn(u8) -> bool) -> String {
    value
        .iter()
        .map(|&b| {
            if ok(b) && b != b'%' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn utf8(uri: &str, name: &str, bytes: Vec<u8>) -> Result<String, VaultError> {
    String::from_utf8(bytes).map_err(|_| bad(uri, format!("`{name}` is not UTF-8")))
}

fn set_once<T>(uri: &str, slot: &mut Option<T>, name: &str, value: T) -> Result<(), VaultError> {
    if slot.is_some() {
        return Err(bad(uri, format!("`{name}` given twice")));
    }
    *slot = Some(value);
    Ok(())
}

impl Pkcs11Uri {
    /// Parses a `pkcs11:` URI (the scheme is case-insensitive, attribute
    /// names are not).
    pub fn parse(uri: &str) -> Result<Pkcs11Uri, VaultError> {
        let rest = uri
            .get(..7)
            .filter(|s| s.eq_ignore_ascii_case("pkcs11:"))
            .map(|_| &uri[7..])
            .ok_or_else(|| bad(uri, "does not start with `pkcs11:`"))?;
        if rest.contains('#') {
            return Err(bad(uri, "fragments (`#`) are not allowed"));
        }
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let mut out = Pkcs11Uri::default();
        let mut seen_vendor = std::collections::BTreeSet::new();
        if !path.is_empty() {
            for attr in path.split(';') {
                let (name, value) = attr
                    .split_once('=')
                    .ok_or_else(|| bad(uri, format!("path attribute `{attr}` has no `=`")))?;
                let raw = percent_decode(value, path_char_ok)
                    .map_err(|e| bad(uri, format!("`{name}`: {e}")))?;
                match name {
                    "token" => set_once(uri, &mut out.token, name, utf8(uri, name, raw)?)?,
                    "manufacturer" => {
                        set_once(uri, &mut out.manufacturer, name, utf8(uri, name, raw)?)?
                    }
                    "serial" => set_once(uri, &mut out.serial, name, utf8(uri, name, raw)?)?,
                    "model" => set_once(uri, &mut out.model, name, utf8(uri, name, raw)?)?,
                    "object" => set_once(uri, &mut out.object, name, utf8(uri, name, raw)?)?,
                    "type" => {
                        let t = utf8(uri, name, raw)?;
                        if t != "data" {
                            return Err(bad(
                                uri,
                                format!("type `{t}`: the vault is stored in `data` objects"),
                            ));
                        }
                        set_once(uri, &mut out.object_type, name, t)?
                    }
                    "slot-id" => {
                        let s = utf8(uri, name, raw)?;
                        let id = s
                            .parse::<u64>()
                            .map_err(|_| bad(uri, format!("slot-id `{s}` is not a number")))?;
                        set_once(uri, &mut out.slot_id, name, id)?
                    }
                    // Standard attributes that would select something oubli
                    // does not use: refusing is safer than ignoring them.
                    "id"
                    | "library-manufacturer"
                    | "library-description"
                    | "library-version"
                    | "slot-description"
                    | "slot-manufacturer" => {
                        return Err(bad(
                            uri,
                            format!("attribute `{name}` is not supported here"),
                        ))
                    }
                    vendor if vendor.starts_with("x-") => {
                        if !seen_vendor.insert(vendor.to_string()) {
                            return Err(bad(uri, format!("`{vendor}` given twice")));
                        }
                    }
                    "" => return Err(bad(uri, "empty attribute name")),
                    other => return Err(bad(uri, format!("unknown attribute `{other}`"))),
                }
            }
        }
        if let Some(query) = query {
            for attr in query.split('&') {
                let (name, value) = attr
                    .split_once('=')
                    .ok_or_else(|| bad(uri, "a query attribute has no `=`"))?;
                let raw = percent_decode(value, query_char_ok).map_err(|e| {
                    // The decoder's message may quote a character of the value.
                    let e = if name == "pin-value" {
                        "malformed value".to_string()
                    } else {
                        e
                    };
                    bad(uri, format!("`{name}`: {e}"))
                })?;
                match name {
                    "module-path" => {
                        let p = utf8(uri, name, raw)?;
                        if !p.starts_with('/') {
                            return Err(bad(uri, "module-path must be absolute"));
                        }
                        set_once(uri, &mut out.module_path, name, PathBuf::from(p))?
                    }
                    "module-name" => {
                        let n = utf8(uri, name, raw)?;
                        if n.is_empty() || n.contains('/') {
                            return Err(bad(uri, "module-name must be a bare name"));
                        }
                        set_once(uri, &mut out.module_name, name, n)?
                    }
                    "pin-value" => set_once(uri, &mut out.pin_value, name, SecretBytes::new(raw))?,
                    "pin-source" => return Err(bad(
                        uri,
                        "pin-source is not supported: use pin-value, OUBLI_PIN, or the password",
                    )),
                    vendor if vendor.starts_with("x-") => {
                        if !seen_vendor.insert(vendor.to_string()) {
                            return Err(bad(uri, format!("`{vendor}` given twice")));
                        }
                    }
                    "" => return Err(bad(uri, "empty query attribute name")),
                    other => return Err(bad(uri, format!("unknown query attribute `{other}`"))),
                }
            }
        }
        if out.module_path.is_some() && out.module_name.is_some() {
            return Err(bad(uri, "give module-path or module-name, not both"));
        }
        Ok(out)
    }

    /// The URI without its PIN, in a canonical order: what `status` shows.
    pub fn redacted(&self) -> String {
        let text = |name: &str, v: &Option<String>| {
            v.as_ref()
                .map(|v| format!("{name}={}", percent_encode(v.as_bytes(), path_char_ok)))
        };
        let path: Vec<String> = [
            text("token", &self.token),
            text("manufacturer", &self.manufacturer),
            text("serial", &self.serial),
            text("model", &self.model),
            self.slot_id.map(|id| format!("slot-id={id}")),
            text("object", &self.object),
            text("type", &self.object_type),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut query = Vec::new();
        if let Some(p) = &self.module_path {
            query.push(format!(
                "module-path={}",
                percent_encode(p.to_string_lossy().as_bytes(), query_char_ok)
            ));
        }
        if let Some(n) = &self.module_name {
            query.push(format!(
                "module-name={}",
                percent_encode(n.as_bytes(), query_char_ok)
            ));
        }
        let mut s = format!("pkcs11:{}", path.join(";"));
        if !query.is_empty() {
            s.push('?');
            s.push_str(&query.join("&"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_form() {
        let u = Pkcs11Uri::parse(
            "pkcs11:token=oubli-test;object=epoch%20key?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=1234",
        )
        .unwrap();
        assert_eq!(u.token.as_deref(), Some("oubli-test"));
        assert_eq!(u.object.as_deref(), Some("epoch key"));
        assert_eq!(
            u.module_path.as_deref(),
            Some(std::path::Path::new("/usr/lib/softhsm/libsofthsm2.so"))
        );
        assert_eq!(u.pin_value.as_ref().unwrap().expose(), b"1234");
        let shown = format!("{u:?}");
        assert!(!shown.contains("1234"), "{shown}");
        assert_eq!(
            u.redacted(),
            "pkcs11:token=oubli-test;object=epoch%20key?module-path=/usr/lib/softhsm/libsofthsm2.so"
        );
        // The redacted form parses back to the same URI without the PIN.
        let back = Pkcs11Uri::parse(&u.redacted()).unwrap();
        assert_eq!(
            back,
            Pkcs11Uri {
                pin_value: None,
                ..u
            }
        );
    }

    #[test]
    fn decodes_escapes_and_accepts_vendor_attributes() {
        let u = Pkcs11Uri::parse(
            "PKCS11:token=My%20Token%3B1;serial=00A1;slot-id=3;type=data;x-foo=bar?x-q=1&module-name=softhsm2",
        )
        .unwrap();
        assert_eq!(u.token.as_deref(), Some("My Token;1"));
        assert_eq!(u.serial.as_deref(), Some("00A1"));
        assert_eq!(u.slot_id, Some(3));
        assert_eq!(u.module_name.as_deref(), Some("softhsm2"));
        assert_eq!(Pkcs11Uri::parse("pkcs11:").unwrap(), Pkcs11Uri::default());
        // A PIN with reserved characters, escaped.
        let u = Pkcs11Uri::parse("pkcs11:token=t?pin-value=a%26b%3D%25").unwrap();
        assert_eq!(u.pin_value.unwrap().expose(), b"a&b=%");
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        for uri in [
            "pkcs12:token=x",
            "token=x",
            "pkcs11:token=x;token=y",
            "pkcs11:tokn=x",
            "pkcs11:token",
            "pkcs11:=x",
            "pkcs11:token=a%2",
            "pkcs11:token=a%zz",
            "pkcs11:token=a b",
            "pkcs11:token=a/b",
            "pkcs11:token=%ff%fe",
            "pkcs11:type=cert",
            "pkcs11:slot-id=-1",
            "pkcs11:id=%01",
            "pkcs11:token=x#frag",
            "pkcs11:token=x?module-path=relative.so",
            "pkcs11:token=x?module-path=/a.so&module-name=b",
            "pkcs11:token=x?pin-value=1&pin-value=2",
            "pkcs11:token=x?pin-source=file:/pin",
            "pkcs11:token=x?pin-value",
            "pkcs11:token=x?colour=blue",
            "pkcs11:token=x?module-name=a/b",
            "pkcs11:x-a=1;x-a=2",
        ] {
            assert!(Pkcs11Uri::parse(uri).is_err(), "{uri} accepted");
        }
        let err = Pkcs11Uri::parse("pkcs11:tokn=x?pin-value=secret").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        // A PIN put in the path by mistake (or with a bad character) is
        // never echoed either (issue 9 item 10).
        for uri in [
            "pkcs11:token=x;pin-value=s3cr3t",
            "pkcs11:pin-value=s3cr3t;token=x",
            "pkcs11:token=x;PIN-VALUE=s3cr3t;object=y",
            "pkcs11:token=x?pin-value=s3cr3t%zz",
            "pkcs11:token=x?pin-value=s3cr3t\u{e9}",
        ] {
            let err = Pkcs11Uri::parse(uri).unwrap_err().to_string();
            assert!(!err.contains("s3cr3t"), "{uri}: {err}");
        }
    }
}
