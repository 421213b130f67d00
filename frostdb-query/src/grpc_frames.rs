//! Following a gRPC body's messages as its frames pass: each message is a 5-byte prefix
//! (a compression flag, then its length, big-endian) and the bytes it states, cut anywhere
//! by the transport's frames. A body wrapper reads the prefixes this way to refuse what a
//! message declares, or a message too many, before the gRPC library decodes it.

/// Where a gRPC body's messages are, as far as its bytes have come.
#[derive(Debug, Default, Clone)]
pub struct MessagePrefixes {
    /// The prefix of the message being read, as far as it has come.
    prefix: [u8; 5],
    have: usize,
    /// Bytes of the current message still to pass.
    left: usize,
    /// Messages begun before the current one.
    before: usize,
}

/// What [`MessagePrefixes::follow_messages`] sees pass.
#[derive(Debug)]
pub enum Passing<'a> {
    /// A message's first byte (the number of messages before it).
    Begun(usize),
    /// A message's prefix is whole.
    Stated {
        /// The length it states.
        len: usize,
        /// Whether its flag says it is compressed.
        compressed: bool,
    },
    /// Bytes of the message, after its prefix.
    Bytes(&'a [u8]),
    /// The message's last byte.
    Ended,
}

impl MessagePrefixes {
    /// Follows `data`, calling `seen(message, len)` when a message's first byte passes
    /// (`len` `None`; `message` counts those before it) and again when its prefix is whole
    /// (`Some` of the length it states). The first error of `seen` stops the following and
    /// is returned.
    pub fn follow<E>(
        &mut self,
        data: &[u8],
        mut seen: impl FnMut(usize, Option<usize>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut message = self.before;
        self.follow_messages(data, |passing| match passing {
            Passing::Begun(n) => {
                message = n;
                seen(n, None)
            }
            Passing::Stated { len, .. } => seen(message, Some(len)),
            Passing::Bytes(_) | Passing::Ended => Ok(()),
        })
    }

    /// Follows `data`, calling `passing` with each step of the messages as it passes: a
    /// message begun, its stated length, its bytes, its end. The first error stops the
    /// following and is returned.
    pub fn follow_messages<E>(
        &mut self,
        mut data: &[u8],
        mut passing: impl FnMut(Passing<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                passing(Passing::Bytes(&data[..n]))?;
                self.left -= n;
                data = &data[n..];
                if self.left == 0 {
                    passing(Passing::Ended)?;
                }
                continue;
            }
            if self.have == 0 {
                passing(Passing::Begun(self.before))?;
            }
            let n = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                let len = u32::from_be_bytes(self.prefix[1..].try_into().expect("4 bytes"));
                passing(Passing::Stated {
                    len: len as usize,
                    compressed: self.prefix[0] != 0,
                })?;
                self.have = 0;
                self.left = len as usize;
                self.before += 1;
                if len == 0 {
                    passing(Passing::Ended)?;
                }
            }
        }
        Ok(())
    }
}
