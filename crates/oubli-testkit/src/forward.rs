//! `forward_crypto!`: writes the `CryptoProvider` methods a test wrapper passes straight to the provider it wraps.

/// Inside `impl CryptoProvider for Wrapper`, writes each named method as a
/// call of the same method on the field `$field` (an
/// `Arc<dyn CryptoProvider>`), so a wrapper spells out only the methods it
/// hooks: `forward_crypto!(inner: name, is_secure, derive);`. Naming the
/// methods, rather than forwarding all but some, keeps each wrapper's list
/// of what it leaves alone in front of the reader.
macro_rules! forward_crypto {
    (@ $f:ident name) => {
        fn name(&self) -> &'static str {
            self.$f.name()
        }
    };
    (@ $f:ident is_secure) => {
        fn is_secure(&self) -> bool {
            self.$f.is_secure()
        }
    };
    (@ $f:ident fill_random) => {
        fn fill_random(&self, out: &mut [u8]) {
            self.$f.fill_random(out)
        }
    };
    (@ $f:ident seal_detached) => {
        fn seal_detached(
            &self,
            key: &::oubli_crypto::SecretKey,
            aad: &[u8],
            buf: &mut [u8],
        ) -> [u8; ::oubli_crypto::TAG_LEN] {
            self.$f.seal_detached(key, aad, buf)
        }
    };
    (@ $f:ident seal) => {
        fn seal(&self, key: &::oubli_crypto::SecretKey, aad: &[u8], buf: &mut Vec<u8>) {
            self.$f.seal(key, aad, buf)
        }
    };
    (@ $f:ident open_in_place) => {
        fn open_in_place(
            &self,
            key: &::oubli_crypto::SecretKey,
            aad: &[u8],
            buf: &mut [u8],
        ) -> Result<usize, ::oubli_crypto::AuthError> {
            self.$f.open_in_place(key, aad, buf)
        }
    };
    (@ $f:ident open_detached) => {
        fn open_detached(
            &self,
            key: &::oubli_crypto::SecretKey,
            aad: &[u8],
            buf: &mut [u8],
            tag: &[u8; ::oubli_crypto::TAG_LEN],
        ) -> Result<(), ::oubli_crypto::AuthError> {
            self.$f.open_detached(key, aad, buf, tag)
        }
    };
    (@ $f:ident open_within) => {
        fn open_within(
            &self,
            key: &::oubli_crypto::SecretKey,
            aad: &[u8],
            buf: &mut [u8],
            src: usize,
        ) -> Result<usize, ::oubli_crypto::AuthError> {
            self.$f.open_within(key, aad, buf, src)
        }
    };
    (@ $f:ident derive) => {
        fn derive(
            &self,
            key: &::oubli_crypto::SecretKey,
            label: &[u8],
            context: &[u8],
        ) -> ::oubli_crypto::SecretKey {
            self.$f.derive(key, label, context)
        }
    };
    ($field:ident: $($method:ident),+ $(,)?) => {
        $($crate::forward::forward_crypto!(@ $field $method);)+
    };
}

pub(crate) use forward_crypto;
