//! TLS to PostgreSQL with rustls, checked as libpq checks it for each
//! `sslmode`: `prefer` and `require` encrypt without checking the
//! certificate (unless a CA is given, which `require` then checks, as libpq
//! does with a root file), `verify-ca` checks the chain, `verify-full` the
//! chain and the host name (lockrun-engines(7) "POSTGRESQL").

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
    /// The chain's check (None: nothing is checked).
    webpki: Option<Arc<WebPkiServerVerifier>>,
    check: Check,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
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
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The roots to check the chain against: the CA file given, else the system's.
fn roots(url: &PgUrl) -> Result<RootCertStore, Error> {
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
        None => {
            let native = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(native.certs);
        }
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
    let webpki = match check {
        Check::Nothing => None,
        _ => Some(
            WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(url)?),
                Arc::clone(&provider),
            )
            .build()
            .map_err(|e| Error::Request(format!("no CA to check the server against: {e}")))?,
        ),
    };
    let algorithms = provider.signature_verification_algorithms;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("setting up TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier {
            webpki,
            check,
            algorithms,
        }))
        .with_no_client_auth();
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}
