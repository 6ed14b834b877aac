//! Copying bytes between the two sockets of a relayed connection.
//!
//! Each direction waits for its source to become readable *before* it
//! takes a buffer, and gives the buffer back once the source has nothing
//! more to read, so an idle connection holds no buffer at all: its cost is
//! the task and two registered sockets. `tokio::io::copy_bidirectional`
//! keeps two 8 KiB buffers for the whole life of a connection, which is
//! 16 KiB per idle connection; at tens of thousands of connections that is
//! the difference between megabytes and gigabytes.
//!
//! The buffer is a `Vec` with capacity only: reads fill its spare capacity
//! (`try_read_buf`), so nothing is zeroed first.

use std::io;

use tokio::net::TcpStream;

use crate::sockets::shutdown_write;

/// Bytes moved by a finished relay, per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// From the client to the endpoint.
    pub to_endpoint: u64,
    /// From the endpoint to the client.
    pub to_client: u64,
}

/// Relays between `client` and `endpoint` until both directions have seen
/// an end of stream (each passed on as a half-close), or either fails.
/// At most one buffer of `buffer_size` bytes per direction exists, and
/// only while data is flowing.
pub async fn relay(
    client: &TcpStream,
    endpoint: &TcpStream,
    buffer_size: usize,
) -> io::Result<Copied> {
    let (to_endpoint, to_client) = tokio::try_join!(
        pump(client, endpoint, buffer_size),
        pump(endpoint, client, buffer_size)
    )?;
    Ok(Copied {
        to_endpoint,
        to_client,
    })
}

/// Copies from `from` to `to` until `from` ends, then half-closes `to`.
async fn pump(from: &TcpStream, to: &TcpStream, buffer_size: usize) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        from.readable().await?;
        let mut buffer = Vec::with_capacity(buffer_size);
        loop {
            match from.try_read_buf(&mut buffer) {
                Ok(0) => {
                    shutdown_write(to)?;
                    return Ok(total);
                }
                Ok(n) => {
                    write_all(to, &buffer).await?;
                    total += n as u64;
                    buffer.clear();
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(error),
            }
        }
    }
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match to.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
