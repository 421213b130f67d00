//! The bucket of databases shared between processes ([`crate::Db::open_shared`],
//! [`crate::Db::open_reader`]): an S3 URL, with the endpoint of an S3-compatible server
//! where it is not AWS.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;

use crate::error::{Error, Result};

/// A bucket and the prefix databases go under: `s3://<bucket>/<prefix>`. Credentials and
/// anything not given here come from the environment as the AWS tools read it
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, ...).
///
/// ```
/// let bucket = frostdb_core::Bucket::new("s3://profiles/fleet-a")
///     .endpoint("http://127.0.0.1:9000")
///     .allow_http(true);
/// assert_eq!(bucket.prefix().unwrap(), "fleet-a");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    /// `s3://<bucket>[/<prefix>]`.
    pub url: String,
    /// An S3-compatible server's address (MinIO, moto, Ceph, ...): `http://host:port`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The bucket's region.
    #[serde(default)]
    pub region: Option<String>,
    /// Allows an `http://` endpoint (loopback test servers; never across a network).
    #[serde(default)]
    pub allow_http: bool,
    /// The access key id, when not from the environment (`AWS_ACCESS_KEY_ID`).
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// The secret access key, when not from the environment (`AWS_SECRET_ACCESS_KEY`).
    #[serde(default)]
    pub secret_access_key: Option<String>,
}

impl Bucket {
    /// The bucket at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Sets the endpoint of an S3-compatible server.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Sets the region.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Allows an `http://` endpoint.
    pub fn allow_http(mut self, allow: bool) -> Self {
        self.allow_http = allow;
        self
    }

    /// Sets the credentials (instead of the environment's).
    pub fn credentials(mut self, key_id: impl Into<String>, secret: impl Into<String>) -> Self {
        self.access_key_id = Some(key_id.into());
        self.secret_access_key = Some(secret.into());
        self
    }

    fn parts(&self) -> Result<(&str, &str)> {
        let invalid = |reason: &str| Error::InvalidOption {
            option: "bucket url",
            reason: format!("{:?}: {reason}", self.url),
        };
        let rest = self
            .url
            .strip_prefix("s3://")
            .ok_or_else(|| invalid("expected s3://<bucket>[/<prefix>]"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("no bucket name"));
        }
        Ok((bucket, prefix.trim_matches('/')))
    }

    /// The prefix under the bucket (`""` for the bucket's root).
    pub fn prefix(&self) -> Result<&str> {
        self.parts().map(|(_, prefix)| prefix)
    }

    /// The object store of the bucket (its root: database prefixes are joined to
    /// [`Bucket::prefix`]). Conditional puts, which the lease and the manifest rely on,
    /// use S3's `If-Match` and `If-None-Match`.
    pub fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        let (bucket, _) = self.parts()?;
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        if self.allow_http {
            builder = builder.with_allow_http(true);
        }
        if let Some(key) = &self.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &self.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let store = builder.build().map_err(|source| Error::ObjectStore {
            context: format!("opening bucket {}", self.url),
            source,
        })?;
        Ok(Arc::new(store))
    }

    /// The prefix of a database `name` under this bucket's prefix.
    pub fn database(&self, name: &str) -> Result<String> {
        let prefix = self.prefix()?;
        Ok(if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_bucket_and_prefix() {
        let b = Bucket::new("s3://profiles/fleet/a/");
        assert_eq!(b.prefix().unwrap(), "fleet/a");
        assert_eq!(b.database("tenants/x").unwrap(), "fleet/a/tenants/x");
        assert_eq!(Bucket::new("s3://profiles").prefix().unwrap(), "");
        assert_eq!(Bucket::new("s3://profiles").database("t").unwrap(), "t");
        for bad in ["profiles", "gs://x/y", "s3://", "s3:///x"] {
            let err = Bucket::new(bad).store().unwrap_err();
            assert!(err.to_string().contains("bucket url"), "{bad}: {err}");
        }
    }
}
