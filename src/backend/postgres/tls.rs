//! TLS to PostgreSQL with rustls, checked as libpq checks it for each
//! `sslmode`: `prefer` and `require` encrypt without checking the
//! certificate (unless a CA is given, which `require` then checks, as libpq
//! does with a root file), `verify-ca` checks the chain, `verify-full` the
//! chain and the host name (README "PostgreSQL").

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::address::{PgUrl, SslMode};
use crate::backend::Error;

/// What of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    check: Check,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.check == Check::Nothing {
            return Ok(ServerCertVerified::assertion());
        }
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.check == Check::Chain => Ok(ServerCertVerified::assertion()),
            done => done,
        }
    }

    // The handshake's signatures are checked in every mode: the key that
    // signs is the certificate's.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// The roots: the CA file given, else (only when a mode checks the chain
/// without one) the system's.
fn roots(url: &PgUrl, check: Check) -> Result<RootCertStore, Error> {
    let mut store = RootCertStore::empty();
    match &url.ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                Error::Request(format!("cannot read the CA file {}: {e}", path.display()))
            })?;
            let certs: Vec<CertificateDer<'static>> =
                rustls::pki_types::pem::PemObject::pem_slice_iter(&pem)
                    .filter_map(Result::ok)
                    .collect();
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(Error::Request(format!(
                    "the CA file {} holds no PEM certificate",
                    path.display()
                )));
            }
        }
        None if check != Check::Nothing => {
            let native = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(native.certs);
        }
        None => {}
    }
    Ok(store)
}

/// The TLS client for `url`, or None when it asks for none.
pub fn connector(url: &PgUrl) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, Error> {
    let check = match (url.sslmode, &url.ca_file) {
        (SslMode::Disable, _) => return Ok(None),
        (SslMode::Prefer, _) | (SslMode::Require, None) => Check::Nothing,
        (SslMode::Require, Some(_)) | (SslMode::VerifyCa, _) => Check::Chain,
        (SslMode::VerifyFull, _) => Check::ChainAndName,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut store = roots(url, check)?;
    if store.is_empty() {
        // Nothing is checked against it, but the verifier wants a root.
        let placeholder = rustls::pki_types::TrustAnchor {
            subject: rustls::pki_types::Der::from_slice(b"\x30\x00"),
            subject_public_key_info: rustls::pki_types::Der::from_slice(b"\x30\x00"),
            name_constraints: None,
        };
        store.roots.push(placeholder);
    }
    let webpki =
        WebPkiServerVerifier::builder_with_provider(Arc::new(store), Arc::clone(&provider))
            .build()
            .map_err(|e| Error::Internal(format!("setting up TLS: {e}")))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("setting up TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier { webpki, check }))
        .with_no_client_auth();
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}
