//! The Docker side of a test node (`node.rs`): the daemon, the image, and starting a
//! node's container on a free host port.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use testcontainers::bollard::Docker;
use testcontainers::core::client::docker_client_instance;
use testcontainers::core::{AccessMode, IntoContainerPort, Mount, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::ports::pick_host_port;
use crate::{image_name, split_image_name, NodeSpec, CONTAINER_LABEL};

/// First start: image start-up limit handed to testcontainers.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at starting a container when its host port turned out to be taken.
const START_ATTEMPTS: usize = 5;

/// testcontainers' shared bollard client.
pub(crate) async fn docker() -> Docker {
    docker_client_instance()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the Docker daemon: {e}"))
}

/// Panics with instructions when the configured image is missing (no registry to pull from).
pub(crate) async fn ensure_image_exists() {
    let image = image_name();
    let docker = docker().await;
    if let Err(e) = docker.inspect_image(&image).await {
        panic!(
            "Redis image {image:?} is not available locally ({e}); build it with \
             scripts/build-redis-image.sh (or set REDQUORUM_REDIS_IMAGE to an image you have)"
        );
    }
}

fn is_port_conflict(message: &str) -> bool {
    message.contains("already allocated") || message.contains("address already in use")
}

/// Removes containers of a failed start attempt that testcontainers left behind.
async fn remove_leftovers(attempt_label: &str) {
    use std::collections::HashMap;
    use testcontainers::bollard::query_parameters::{
        ListContainersOptions, RemoveContainerOptions,
    };
    let docker = docker().await;
    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("org.redquorum.testkit.attempt={attempt_label}")],
    )]);
    let Ok(list) = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
    else {
        return;
    };
    for id in list.into_iter().filter_map(|c| c.id) {
        let _ = docker
            .remove_container(
                &id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await;
    }
}

/// What a node's container is started with, whatever host port it gets.
struct Launch {
    index: usize,
    image: String,
    /// The image's name and tag.
    name: String,
    tag: String,
    /// The node's data directory on the host (mounted at `/data`).
    data_path: String,
    /// The wall-clock shim's directory on the host (mounted at `/clock`).
    clock_path: String,
    /// Mounted at `/tls`: the test PKI in secure mode, else the clock directory (unread).
    pki_path: String,
    /// `uid:gid` of the data directory's owner.
    user: String,
    /// redis-server's arguments.
    args: Vec<String>,
}

impl Launch {
    fn new(index: usize, spec: &NodeSpec, data_dir: &Path, clock_dir: &Path) -> Launch {
        let image = image_name();
        let (name, tag) = split_image_name(&image);
        let data_path = data_dir
            .to_str()
            .unwrap_or_else(|| panic!("node {index}: data dir {data_dir:?} is not UTF-8"))
            .to_string();
        let clock_path = clock_dir
            .to_str()
            .unwrap_or_else(|| panic!("node {index}: clock dir {clock_dir:?} is not UTF-8"))
            .to_string();
        // Run redis-server as the owner of the data directory, so that everything it writes
        // there can be deleted by this process (wipe, TempDir cleanup) also when not root. The
        // clock directory has the same owner (this process made both), so it can read the shim.
        let user = {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(data_dir)
                .unwrap_or_else(|e| panic!("node {index}: cannot stat {data_dir:?}: {e}"));
            format!("{}:{}", meta.uid(), meta.gid())
        };
        // Secure mode: TLS only, client certificates required, the PKI mounted at /tls. Without
        // it the clock directory is mounted there too (nothing reads it).
        let mut args = spec.args();
        let pki_path = match crate::secure::secure() {
            Some(s) => {
                args.extend(s.pki.server_args("/tls", 6379, "yes"));
                s.pki.dir().to_string_lossy().into_owned()
            }
            None => clock_path.clone(),
        };
        Launch {
            index,
            image,
            name,
            tag,
            data_path,
            clock_path,
            pki_path,
            user,
            args,
        }
    }

    /// Start the container on `host_port`, labelled with `attempt` (for its clean-up).
    async fn start(
        &self,
        host_port: u16,
        attempt: &str,
    ) -> Result<ContainerAsync<GenericImage>, testcontainers::TestcontainersError> {
        GenericImage::new(self.name.clone(), self.tag.clone())
            .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
            .with_cmd(self.args.clone())
            .with_mapped_port(host_port, 6379.tcp())
            .with_mount(Mount::bind_mount(self.data_path.clone(), "/data"))
            .with_mount(
                Mount::bind_mount(self.pki_path.clone(), "/tls")
                    .with_access_mode(AccessMode::ReadOnly),
            )
            // The wall-clock shim and the node's offset file; the node only reads them.
            .with_mount(
                Mount::bind_mount(self.clock_path.clone(), "/clock")
                    .with_access_mode(AccessMode::ReadOnly),
            )
            .with_env_var("LD_PRELOAD", "/clock/clockstep.so")
            .with_env_var(crate::clock::OFFSET_FILE_ENV, "/clock/offset")
            .with_user(self.user.clone())
            .with_label(CONTAINER_LABEL, self.index.to_string())
            .with_label("org.redquorum.testkit.attempt", attempt)
            .with_startup_timeout(STARTUP_TIMEOUT)
            .with_host_config_modifier(|host_config| {
                // Publish on loopback only.
                if let Some(bindings) = host_config.port_bindings.as_mut() {
                    for binding in bindings.values_mut().flatten().flatten() {
                        binding.host_ip = Some("127.0.0.1".to_string());
                    }
                }
            })
            .start()
            .await
    }
}

/// Start node `index`'s container on a free host port (another one if the port turned out to
/// be taken); returns it with the port.
pub(crate) async fn start_container(
    index: usize,
    spec: &NodeSpec,
    data_dir: &Path,
    clock_dir: &Path,
) -> (ContainerAsync<GenericImage>, u16) {
    static ATTEMPT: AtomicU64 = AtomicU64::new(0);
    let launch = Launch::new(index, spec, data_dir, clock_dir);
    let mut last_error = String::new();
    for _ in 0..START_ATTEMPTS {
        let host_port = pick_host_port();
        let attempt = format!(
            "{}-{}",
            std::process::id(),
            ATTEMPT.fetch_add(1, Ordering::Relaxed)
        );
        match launch.start(host_port, &attempt).await {
            Ok(container) => return (container, host_port),
            Err(e) => {
                last_error = e.to_string();
                remove_leftovers(&attempt).await;
                if !is_port_conflict(&last_error) {
                    break;
                }
                tracing::debug!(node = index, host_port, "host port taken, retrying");
            }
        }
    }
    panic!(
        "node {index}: could not start a container from image {:?}: {last_error} \
         (is the image built? scripts/build-redis-image.sh)",
        launch.image
    );
}
