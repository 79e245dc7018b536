//! TLS to PostgreSQL with rustls (tokio-postgres-rustls), with libpq's `sslmode` meanings:
//!
//! | sslmode | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `allow`, `prefer` (the default) | when the server offers it | not checked (as libpq) |
//! | `require` | always | not checked; checked as `verify-ca` when `sslrootcert` is given (as libpq) |
//! | `verify-ca` | always | chains to `sslrootcert` (or the webpki roots) |
//! | `verify-full` | always | chains, and names the host connected to |
//!
//! `sslmode` and `sslrootcert` come from DATABASE_URL (or PG_USE_SSL, PG_SSL_REJECT_UNAUTHORIZED
//! and PG_SSL_ROOT_CERT, Queen's settings). tokio-postgres itself knows only disable, prefer and
//! require and refuses `sslrootcert`: the URL is read here first and handed on with those.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(s: &str) -> Result<SslMode, String> {
        match s {
            "disable" => Ok(SslMode::Disable),
            "allow" | "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            other => Err(format!(
                "sslmode must be disable, allow, prefer, require, verify-ca or verify-full, got {other:?}"
            )),
        }
    }

    /// What tokio-postgres is told: whether TLS is attempted, and whether it is required.
    pub(crate) fn for_driver(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// How the broker talks TLS to PostgreSQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// PEM file of the certificates the server's must chain to (libpq's sslrootcert).
    pub root_cert: Option<String>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            mode: SslMode::Prefer,
            root_cert: None,
        }
    }
}

/// The connector for `settings`; the root certificates are read now, so a bad file fails start-up.
pub fn connector(settings: &TlsSettings) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verify = match (settings.mode, &settings.root_cert) {
        (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => None,
        (SslMode::Require | SslMode::VerifyCa, _) => Some(false),
        (SslMode::VerifyFull, _) => Some(true),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS to PostgreSQL: {e}"))?;
    let config = match verify {
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth(),
        Some(check_name) => {
            let roots = Arc::new(roots(settings.root_cert.as_deref())?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| format!("TLS to PostgreSQL: the root certificates: {e}"))?;
            let verifier: Arc<dyn ServerCertVerifier> = if check_name {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

fn roots(path: Option<&str>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match path {
        None => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(p) => {
            let certs = CertificateDer::pem_file_iter(p)
                .map_err(|e| format!("sslrootcert {p}: {e}"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("sslrootcert {p}: {e}"))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!("sslrootcert {p}: no certificate in it"));
            }
        }
    }
    Ok(store)
}

/// `prefer` and `require` without a root: any certificate (libpq's meaning), though the
/// handshake's signatures are still checked against the one presented.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must verify; the name in the certificate is not compared.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Takes `sslmode` and `sslrootcert` out of a connection string (URL or `key=value` form),
/// returning the rest for tokio-postgres and what they said.
pub fn split_tls_options(url: &str) -> Result<(String, Option<SslMode>, Option<String>), String> {
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: String| -> Result<bool, String> {
        match key {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => root = Some(value),
            _ => return Ok(false),
        }
        Ok(true)
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((head, query)) = url.split_once('?') else {
            return Ok((url.to_string(), None, None));
        };
        let mut kept = vec![];
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(v)
                .decode_utf8()
                .map_err(|e| format!("DATABASE_URL option {k}: {e}"))?
                .into_owned();
            if !take(k, value)? {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            head.to_string()
        } else {
            format!("{head}?{}", kept.join("&"))
        };
        return Ok((rest, mode, root));
    }
    // key=value form (values without spaces for these two options).
    let mut kept = vec![];
    for word in url.split_whitespace() {
        match word.split_once('=') {
            Some((k, v)) if take(k, v.trim_matches('\'').to_string())? => {}
            _ => kept.push(word),
        }
    }
    Ok((kept.join(" "), mode, root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_either_form() {
        let (rest, mode, root) = split_tls_options(
            "postgres://u@h:5/db?sslmode=verify-full&application_name=q&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h:5/db?application_name=q");
        assert_eq!(mode, Some(SslMode::VerifyFull));
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));
        let (rest, mode, root) = split_tls_options("host=h sslmode=require dbname=d").unwrap();
        assert_eq!(
            (rest.as_str(), mode, root),
            ("host=h dbname=d", Some(SslMode::Require), None)
        );
        assert_eq!(
            split_tls_options("postgres://h/db").unwrap(),
            ("postgres://h/db".to_string(), None, None)
        );
        assert!(split_tls_options("postgres://h/db?sslmode=sometimes").is_err());
    }

    #[test]
    fn connectors_build_for_every_mode() {
        for mode in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert!(connector(&TlsSettings {
                mode,
                root_cert: None
            })
            .is_ok());
        }
        let missing = TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some("/nonexistent/ca.pem".into()),
        };
        assert!(connector(&missing).is_err());
    }
}
