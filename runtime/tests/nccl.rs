//! The NCCL communicator.
//!
//! Runs everywhere: without NCCL, joining a group is a clear error naming
//! the library and the fix, not a panic. The GPU test is ignored (no GPU in
//! CI); NCCL refuses two ranks on one GPU, so on a one-GPU machine it is a
//! group of one — which still drives every call (ids through the store,
//! `ncclCommInitRank`, each collective on host slices and on device
//! pointers, in f32 and bf16) and checks the copies and offsets:
//!
//! ```sh
//! cargo test -p zeroplan-runtime --test nccl -- --ignored --nocapture
//! ```
//!
//! (needs `libnccl.so.2` on the library path: the `nvidia-nccl-cu13` wheel's
//! `lib/` or the system package). Several GPUs: `zeroplan launch` in
//! `tests/launch.rs` (`launched_cuda_ranks_train_as_the_host_runtime`).

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use zeroplan_backend_cuda::{Nccl, nccl};
use zeroplan_ir::DType;
use zeroplan_runtime::comm::{CommError, Communicator, JobToken, Store, StoreConfig, StoreServer};

fn store() -> (StoreServer, Store) {
    let config = StoreConfig::new(JobToken::generate().unwrap(), Duration::from_secs(5));
    let server = StoreServer::bind("127.0.0.1:0", &config).unwrap();
    let store = Store::connect(&server.addr().to_string(), &config).unwrap();
    (server, store)
}

#[test]
fn without_nccl_joining_is_a_clear_error() {
    let Err(why) = nccl::probe() else {
        eprintln!("SKIPPED: NCCL is installed here; the ignored test is the one to run");
        return;
    };
    assert!(why.contains("libnccl.so.2") && why.contains("ZEROPLAN_COMM=tcp"), "{why}");
    let (_server, store) = store();
    match Nccl::join(&store, "g", 0, 1, 0) {
        Err(CommError::Join { group, rank: 0, message }) => assert!(group == "g" && message == why, "{message}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("joined an NCCL group without NCCL"),
    }
}

fn values(len: usize) -> Vec<f32> {
    (0..len).map(|i| (i as f32 * 0.37).sin() * 1e3).collect()
}

#[test]
#[ignore = "needs a GPU and NCCL"]
fn a_group_of_one_runs_every_collective_on_host_slices_and_device_pointers() {
    println!("NCCL {}", nccl::probe().unwrap());
    let (_server, store) = store();
    let comm = Nccl::join(&store, "one", 0, 1, 0).unwrap();
    assert!(comm.device_collectives().is_some_and(|d| d.is::<Nccl>()));
    // Host slices, through the scratch buffer: a sum over one rank is its data.
    let x = values(1000);
    let mut summed = x.clone();
    comm.all_reduce(&mut summed).unwrap();
    assert_eq!(summed, x);
    let mut part = vec![0.0; 1000];
    comm.reduce_scatter(&x, &mut part).unwrap();
    assert_eq!(part, x);
    let mut all = vec![0.0; 1000];
    comm.all_gather(&x, &mut all).unwrap();
    assert_eq!(all, x);
    let mut shared = x.clone();
    comm.broadcast(&mut shared, 0).unwrap();
    assert_eq!(shared, x);
    comm.barrier().unwrap();
    // Device pointers, after work queued on another stream, in f32 and bf16.
    let context = CudaContext::new(0).unwrap();
    let compute = context.new_stream().unwrap();
    for (dtype, bytes) in [(DType::F32, 4), (DType::BF16, 2)] {
        let host: Vec<u8> = match dtype {
            DType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => x.iter().flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes()).collect(),
        };
        let input = compute.clone_htod(&host).unwrap();
        let mut output = compute.alloc_zeros::<u8>(host.len()).unwrap();
        {
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let (src, _s) = input.device_ptr(&compute);
            let (dst, _d) = output.device_ptr_mut(&compute);
            let n = host.len() / bytes;
            // SAFETY: both allocations hold `n` elements of `dtype` on GPU 0.
            unsafe {
                comm.all_reduce_device(src, dst, n, dtype, &compute).unwrap();
                comm.reduce_scatter_device(src, dst, n, dtype, &compute).unwrap();
                comm.all_gather_device(src, dst, n, dtype, &compute).unwrap();
            }
        }
        assert_eq!(compute.clone_dtoh(&output).unwrap(), host, "{dtype:?}");
    }
    // An aborted communicator refuses further calls instead of hanging.
    let comm: Arc<dyn Communicator> = Arc::new(comm);
    comm.abort();
    assert!(matches!(comm.all_reduce(&mut [1.0]), Err(CommError::PeerFailed { .. })));
}
