use super::*;

fn tensor(len: usize, base: u64) -> AdamWTensor {
    AdamWTensor { param: base, grad: base + 8, m: base + 16, v: base + 24, working: None, len, weight_decay: 0.01 }
}

fn words(entry: &[u8]) -> Vec<u64> {
    entry.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap())).collect()
}

#[test]
fn the_table_lists_non_empty_tensors_with_their_first_chunk() {
    let k = AdamWKernel { grad: DType::BF16, working: None };
    let tensors = [tensor(1, 0x100), tensor(0, 0x200), tensor(CHUNK, 0x300), tensor(2 * CHUNK + 1, 0x400)];
    let t = k.table(&tensors).unwrap();
    assert_eq!((t.tensors, t.chunks), (3, 1 + 1 + 3));
    assert_eq!(t.bytes.len(), 3 * ENTRY_BYTES);
    let last = words(&t.bytes[2 * ENTRY_BYTES..]);
    // param, grad, m, v, working, len, first_chunk, weight decay (f64 bits).
    assert_eq!(&last[..7], &[0x400, 0x408, 0x410, 0x418, 0, 2 * CHUNK as u64 + 1, 2]);
    assert_eq!(f64::from_bits(last[7]), 0.01);
    assert_eq!(words(&t.bytes[ENTRY_BYTES..])[6], 1);
    // The grid: one block per chunk, capped per multiprocessor.
    assert_eq!(t.launch(&DeviceProperties::H100_SXM), (5, THREADS));
    let many = AdamWTable { chunks: 1 << 20, ..t };
    assert_eq!(many.launch(&DeviceProperties::H100_SXM).0, 132 * BLOCKS_PER_SM);
    let none = k.table(&[tensor(0, 0x100)]).unwrap();
    assert_eq!((none.tensors, none.chunks, none.launch(&DeviceProperties::H100_SXM).0), (0, 0, 0));
}

#[test]
fn working_copies_are_all_or_none() {
    let mixed = AdamWKernel { grad: DType::F32, working: Some(DType::BF16) };
    let with = AdamWTensor { working: Some(0x900), ..tensor(10, 0x100) };
    let t = mixed.table(&[with]).unwrap();
    assert_eq!(words(&t.bytes)[4], 0x900);
    let e = mixed.table(&[with, tensor(10, 0x200)]).unwrap_err();
    assert_eq!(
        e,
        AdamWError::Tensor { index: 1, message: "no working copy, but the kernel writes one for every tensor".into() }
    );
    let plain = AdamWKernel { grad: DType::F32, working: None };
    assert!(plain.table(&[with]).unwrap_err().to_string().contains("rendered without one"));
    assert!(mixed.table(&[AdamWTensor { working: Some(0), ..with }]).is_err());
}

#[test]
fn bad_tensors_and_types_are_clear_errors() {
    let k = AdamWKernel { grad: DType::F32, working: None };
    let e = k.table(&[tensor(4, 0x100), AdamWTensor { m: 0, ..tensor(4, 0x200) }]).unwrap_err();
    assert!(e.to_string().starts_with("tensor 1 of the AdamW table: a null pointer"), "{e}");
    let e = k.table(&[AdamWTensor { weight_decay: f64::NAN, ..tensor(4, 0x100) }]).unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    assert_eq!(AdamWKernel { grad: DType::I64, working: None }.render(), Err(AdamWError::GradDtype(DType::I64)));
    let f32_working = AdamWKernel { grad: DType::F32, working: Some(DType::F32) };
    assert!(f32_working.render().unwrap_err().to_string().contains("f32 training has none"));
}

#[test]
fn every_specialisation_renders_its_own_symbol() {
    let mut seen = std::collections::HashSet::new();
    for grad in [DType::F32, DType::BF16, DType::F16] {
        for working in [None, Some(DType::BF16), Some(DType::F16)] {
            let r = AdamWKernel { grad, working }.render().unwrap();
            assert!(seen.insert(r.entry.clone()));
            assert!(r.source.contains(&format!("{}(", r.entry)) && !r.source.contains('$'));
            assert_eq!(r.source.contains("cuda_bf16.h"), grad == DType::BF16 || working == Some(DType::BF16));
        }
    }
    assert!(
        seen.contains("zp_multi_tensor_adamw_grad_bf16") && seen.contains("zp_multi_tensor_adamw_grad_f32_working_f16")
    );
}
