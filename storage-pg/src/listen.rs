//! Deliverability events from every broker on the database: LISTEN on a dedicated connection.

use queen_core::events::DeliveryEvent;

use crate::PgStorage;

impl PgStorage {
    /// Listens for deliverability events committed by any broker on this database (`NOTIFY
    /// queen_push` from push_v6, `NOTIFY queen_event` from the triggers of migration 009) on a
    /// dedicated connection, and sends each to `events`. Every (re)connection is followed by a
    /// `Resync`: notifications sent while nobody listened are lost, so the broker re-reads what
    /// it may have missed. Reconnects after a second; returns when the receiver is gone.
    /// The connection uses the pool's settings and TLS.
    pub fn listen_events(
        &self,
        events: tokio::sync::mpsc::UnboundedSender<DeliveryEvent>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (config, tls) = self.listen.clone();
        Self::listen_with(config, tls, events)
    }

    async fn listen_with(
        config: tokio_postgres::Config,
        tls: tokio_postgres_rustls::MakeRustlsConnect,
        events: tokio::sync::mpsc::UnboundedSender<DeliveryEvent>,
    ) {
        loop {
            match config.connect(tls.clone()).await {
                Ok((client, mut connection)) => {
                    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
                    let forward = events.clone();
                    let driver = tokio::spawn(async move {
                        let mut done_tx = Some(done_tx);
                        loop {
                            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                                    let Some(event) = notification_event(n.channel(), n.payload())
                                    else {
                                        tracing::warn!(
                                            channel = n.channel(),
                                            payload = n.payload(),
                                            "unreadable notification"
                                        );
                                        continue;
                                    };
                                    if forward.send(event).is_err() {
                                        break;
                                    }
                                }
                                Some(Ok(_)) => {}
                                Some(Err(_)) | None => break,
                            }
                        }
                        if let Some(d) = done_tx.take() {
                            let _ = d.send(());
                        }
                    });
                    if let Err(e) = client.batch_execute(LISTEN).await {
                        let e = crate::pg_err("LISTEN")(e);
                        tracing::warn!(error = %e, "LISTEN failed; retrying");
                    } else {
                        tracing::info!("listening for deliverability events from every broker");
                        if events.send(DeliveryEvent::Resync).is_err() {
                            driver.abort();
                            return;
                        }
                        tokio::select! {
                            _ = &mut done_rx => {}
                            _ = events.closed() => {
                                driver.abort();
                                return;
                            }
                        }
                    }
                    driver.abort();
                    tracing::warn!("event notification connection lost; reconnecting");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open the event notification connection; retrying")
                }
            }
            if events.is_closed() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
}

/// Waiting idle is this connection's job, so a database's or role's `idle_session_timeout`
/// (PostgreSQL 14 and later; where the setting does not exist nothing is set) is turned off for
/// it: otherwise the server closes it every period, and each time notifications are lost until
/// the reconnect and its resync.
/// LISTEN comes first, so the session's query in `pg_stat_activity` starts with it.
const LISTEN: &str = "LISTEN queen_push; LISTEN queen_event;
                      SELECT set_config(name, '0', false) FROM pg_settings
                       WHERE name = 'idle_session_timeout'";

/// A notification as an event: push_v3's `queue\npartition\ncount` on `queen_push`, the
/// triggers' payloads on `queen_event`.
fn notification_event(channel: &str, payload: &str) -> Option<DeliveryEvent> {
    match channel {
        "queen_push" => DeliveryEvent::parse(&format!("push\n{payload}")),
        "queen_event" => DeliveryEvent::parse(payload),
        _ => None,
    }
}

#[cfg(test)]
mod notification_tests {
    use super::*;

    #[test]
    fn push_and_trigger_payloads_parse() {
        assert_eq!(
            notification_event("queen_push", "q\np\n3"),
            Some(DeliveryEvent::Pushed {
                queue: "q".into(),
                partition: "p".into(),
                count: 3
            })
        );
        assert_eq!(
            notification_event("queen_event", "group\nq\ng"),
            Some(DeliveryEvent::GroupReset {
                queue: Some("q".into()),
                group: "g".into()
            })
        );
        assert_eq!(notification_event("other", "x"), None);
    }
}
