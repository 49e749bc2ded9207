//! Running one subcommand: connect, make the call(s), print the reply, and map the outcome to
//! an exit code.

use std::process::ExitCode;

use tonic::{Code, Status};

use crate::connect::{connect, request};
use crate::print::{print_event, print_list, print_reservations, print_status};
use crate::{
    pb, read, Args, Command, Output, EXIT_NOT_ALLOWED, EXIT_NOT_FOUND, EXIT_REFUSED,
    EXIT_UNREACHABLE, EXIT_USAGE,
};

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_default()
}

/// `ipoolctl health`: the gRPC health check, as an exit code.
async fn health(args: &Args, service: &str, live: bool) -> ExitCode {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let channel = match crate::connect::channel(args).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let asked = HealthCheckRequest {
        service: service.to_string(),
    };
    match HealthClient::new(channel).check(asked).await {
        Ok(r) => {
            let status = r.into_inner().status();
            outln!("{}", status.as_str_name());
            match status {
                ServingStatus::Serving => ExitCode::SUCCESS,
                _ if live => ExitCode::SUCCESS,
                _ => ExitCode::from(EXIT_REFUSED),
            }
        }
        Err(s) if s.code() == Code::NotFound => {
            eprintln!("ipoolctl: ipoold has no service {service:?}");
            ExitCode::from(EXIT_REFUSED)
        }
        Err(s) => {
            eprintln!("ipoolctl: health check failed: {}", s.message());
            ExitCode::from(EXIT_UNREACHABLE)
        }
    }
}

pub(super) async fn run(args: Args) -> ExitCode {
    if let Command::Cluster { etcd, command } = &args.command {
        return crate::cluster::run(etcd, command, args.output).await;
    }
    if let Command::Health { service, live } = &args.command {
        return health(&args, service, *live).await;
    }
    let token = match &args.token_file {
        Some(p) => match read(p, "--token-file") {
            Ok(b) => Some(String::from_utf8_lossy(&b).trim().to_string()),
            Err(e) => {
                eprintln!("ipoolctl: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => None,
    };
    let mut client = match connect(&args).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let out = args.output;
    let result: Result<(), Status> = async {
        match &args.command {
            Command::Status { network } => {
                let r = client
                    .pool_status(request(
                        pb::PoolStatusRequest {
                            network: opt(network),
                        },
                        &token,
                    )?)
                    .await?;
                print_status(&r.into_inner(), out);
            }
            Command::List {
                network,
                namespace,
                pod,
                address,
                container,
            } => {
                let mut all = pb::ListAllocationsResponse::default();
                let mut page_token = String::new();
                loop {
                    let r = client
                        .list_allocations(request(
                            pb::ListAllocationsRequest {
                                network: opt(network),
                                namespace: opt(namespace),
                                pod: opt(pod),
                                address: opt(address),
                                container_id: opt(container),
                                page_size: 1000,
                                page_token: page_token.clone(),
                            },
                            &token,
                        )?)
                        .await?
                        .into_inner();
                    all.allocations.extend(r.allocations);
                    if r.next_page_token.is_empty() {
                        break;
                    }
                    page_token = r.next_page_token;
                }
                print_list(&all, out);
            }
            Command::Get {
                network,
                container,
                ifname,
                address,
            } => {
                let r = client
                    .get_allocation(request(
                        pb::GetAllocationRequest {
                            network: network.clone(),
                            container_id: opt(container),
                            ifname: ifname.clone(),
                            address: opt(address),
                        },
                        &token,
                    )?)
                    .await?;
                print_list(
                    &pb::ListAllocationsResponse {
                        allocations: vec![r.into_inner()],
                        next_page_token: String::new(),
                    },
                    out,
                );
            }
            Command::Reservations { network } => {
                let r = client
                    .list_reservations(request(
                        pb::ListReservationsRequest {
                            network: opt(network),
                        },
                        &token,
                    )?)
                    .await?;
                print_reservations(&r.into_inner().reservations, out);
            }
            Command::Reserve {
                network,
                namespace,
                pod,
                addresses,
                ttl,
                reason,
            } => {
                let r = client
                    .reserve(request(
                        pb::ReserveRequest {
                            network: network.clone(),
                            namespace: namespace.clone(),
                            name: pod.clone(),
                            addresses: addresses.clone(),
                            ttl_secs: *ttl,
                            reason: reason.clone(),
                        },
                        &token,
                    )?)
                    .await?;
                print_reservations(&[r.into_inner()], out);
            }
            Command::Unreserve {
                network,
                namespace,
                pod,
            } => {
                let r = client
                    .unreserve(request(
                        pb::UnreserveRequest {
                            network: network.clone(),
                            namespace: namespace.clone(),
                            name: pod.clone(),
                        },
                        &token,
                    )?)
                    .await?;
                print_reservations(&[r.into_inner()], out);
            }
            Command::Release {
                network,
                container,
                ifname,
                reason,
            } => {
                let r = client
                    .release(request(
                        pb::ReleaseRequest {
                            network: network.clone(),
                            container_id: container.clone(),
                            ifname: ifname.clone(),
                            reason: reason.clone(),
                        },
                        &token,
                    )?)
                    .await?
                    .into_inner();
                match out {
                    Output::Json => outln!("{}", serde_json::json!({ "released": r.released })),
                    Output::Table => outln!("released {}", r.released.join(", ")),
                }
            }
            Command::Drain { network, undo } => {
                let r = client
                    .drain(request(
                        pb::DrainRequest {
                            network: opt(network),
                            drain: !undo,
                        },
                        &token,
                    )?)
                    .await?
                    .into_inner();
                match out {
                    Output::Json => outln!("{}", serde_json::json!({ "drained": r.drained })),
                    Output::Table if r.drained.is_empty() => outln!("no network is drained"),
                    Output::Table => outln!("drained: {}", r.drained.join(", ")),
                }
            }
            Command::Watch { network } => {
                let mut stream = client
                    .watch(request(
                        pb::WatchRequest {
                            network: opt(network),
                        },
                        &token,
                    )?)
                    .await?
                    .into_inner();
                if out == Output::Table {
                    outln!("TIME(ms)  KIND  NETWORK  POD  CONTAINER  ADDRESSES  REASON");
                }
                while let Some(e) = stream.message().await? {
                    print_event(&e, out);
                }
            }
            // Answered above, without the Ops client.
            Command::Health { .. } | Command::Cluster { .. } => {}
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(status) => {
            let (code, hint) = match status.code() {
                Code::NotFound => (EXIT_NOT_FOUND, ""),
                Code::Unauthenticated => (
                    EXIT_NOT_ALLOWED,
                    " (pass --token-file with the token of ipoold's --ops-token-file, or use mTLS)",
                ),
                Code::PermissionDenied => (EXIT_NOT_ALLOWED, ""),
                Code::Unavailable => (
                    EXIT_UNREACHABLE,
                    " (ipoold is restarting, overloaded or draining; try again)",
                ),
                Code::InvalidArgument => (EXIT_REFUSED, " (see ipoolctl <command> --help)"),
                _ => (EXIT_REFUSED, ""),
            };
            eprintln!(
                "ipoolctl: ipoold: {:?}: {}{hint}",
                status.code(),
                status.message()
            );
            ExitCode::from(code)
        }
    }
}
