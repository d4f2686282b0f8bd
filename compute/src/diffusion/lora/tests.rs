use std::collections::BTreeSet;
use std::io::Read;

use super::*;
use crate::models::safetensors::write_f32_safetensors;

/// A tensor to write: name, shape, values.
type Named = (String, Vec<usize>, Vec<f32>);

/// Writes `tensors` as a LoRA file `name` in `dir`.
fn lora_file(dir: &Path, name: &str, tensors: &[Named]) -> Lora {
    let path = dir.join(name);
    write_f32_safetensors(&path, tensors, &BTreeMap::new()).unwrap();
    Lora::read(&path, name).unwrap()
}

/// `n` values `start, start + step, ...`.
fn ramp(n: usize, start: f32, step: f32) -> Vec<f32> {
    (0..n).map(|i| start + step * i as f32).collect()
}

/// A random tiny SDXL checkpoint in `dir` and its tensors of `component`.
fn tiny_sdxl_component(dir: &Path, component: Component) -> HashMap<String, Tensor> {
    let path = dir.join("tiny-sdxl.safetensors");
    if !path.exists() {
        crate::models::write_random_checkpoint(&path, &ModelConfig::tiny_sdxl(), 2).unwrap();
    }
    load_component(&path, &ModelConfig::tiny_sdxl(), component, &Device::Cpu).unwrap()
}

/// The names of the tensors of `after` that differ from `before`.
fn changed(before: &HashMap<String, Tensor>, after: &HashMap<String, Tensor>) -> BTreeSet<String> {
    after
        .iter()
        .filter(|(k, v)| crate::max_abs_diff(v, &before[*k]) > 0.0)
        .map(|(k, _)| k.clone())
        .collect()
}

/// ComfyUI's key map (tests/fixtures/sdxl-components/lora_keys.json.gz, from its own
/// `model_lora_keys_unet` / `model_lora_keys_clip`).
fn comfyui_key_map() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sdxl-components/lora_keys.json.gz");
    let mut json = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut json)
        .unwrap();
    serde_json::from_str(&json).unwrap()
}

#[test]
fn every_key_comfyui_maps_patches_the_same_tensor_and_no_other_key_maps() {
    let fixture = comfyui_key_map();
    for (name, cfg) in [
        ("sd1", ModelConfig::sd1()),
        ("sdxl", ModelConfig::sdxl()),
        ("sdxl_refiner", ModelConfig::sdxl_refiner()),
    ] {
        let ours = targets(&cfg);
        let model = &fixture["models"][name];
        let mut theirs = BTreeSet::new();
        for (target, keys) in model["targets"].as_object().unwrap() {
            let (checkpoint_name, part) = target.split_once('#').unwrap_or((target, ""));
            let (component, tensor) =
                ldm_to_candle(checkpoint_name, &cfg).unwrap_or_else(|| panic!("{name}: {checkpoint_name} unmapped"));
            let part = match part {
                "" => Part::Whole,
                "q" => Part::Third(0),
                "k" => Part::Third(1),
                "v" => Part::Third(2),
                "T" => Part::Transposed,
                other => panic!("part {other}"),
            };
            for key in keys.as_array().unwrap() {
                let key = key.as_str().unwrap();
                let got = ours
                    .get(key)
                    .unwrap_or_else(|| panic!("{name}: weft does not map {key} (ComfyUI: {target})"));
                assert_eq!(
                    (got.component, got.tensor.as_str(), got.part),
                    (component, tensor.as_str(), part),
                    "{name}: {key}"
                );
                theirs.insert(key.to_string());
            }
        }
        // Keys for weights no checkpoint has (ViT-L's unused projection) are ignored.
        for key in model["unheld"].as_object().unwrap().keys() {
            assert!(!ours.contains_key(key), "{name}: {key}");
        }
        let extra: Vec<_> = ours.keys().filter(|k| !theirs.contains(*k)).take(5).collect();
        assert!(extra.is_empty(), "{name}: weft maps keys ComfyUI does not: {extra:?}");
        assert!(theirs.len() > 2000, "{name}: {}", theirs.len());
    }
}

#[test]
fn kohya_diffusers_and_generic_key_forms_map_for_sdxl() {
    let map = targets(&ModelConfig::sdxl());
    let target = |key: &str| {
        let t = map.get(key).unwrap_or_else(|| panic!("{key} unmapped"));
        (t.component, t.tensor.clone(), t.part)
    };
    let q = (
        Component::Unet,
        "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight".to_string(),
        Part::Whole,
    );
    for key in [
        "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q",
        "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q",
        "lycoris_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q",
        "diffusion_model.input_blocks.4.1.transformer_blocks.0.attn1.to_q",
        "down_blocks.1.attentions.0.transformer_blocks.0.attn1.processor.to_q",
        "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.processor.to_q",
    ] {
        assert_eq!(target(key), q, "{key}");
    }
    // SDXL's deepest level: input_blocks.7 is down_blocks.2, its tenth transformer block.
    assert_eq!(
        target("lora_unet_input_blocks_7_1_transformer_blocks_9_attn2_to_k").1,
        "down_blocks.2.attentions.0.transformer_blocks.9.attn2.to_k.weight"
    );
    assert_eq!(
        target("unet.up_blocks.0.attentions.2.transformer_blocks.9.attn1.processor.to_out").1,
        "up_blocks.0.attentions.2.transformer_blocks.9.attn1.to_out.0.weight"
    );
    // The linear projections, and LoCon's convolutions.
    assert_eq!(map["lora_unet_middle_block_1_proj_in"].shape, vec![1280, 1280]);
    assert_eq!(
        target("lora_unet_input_blocks_1_0_in_layers_2").1,
        "down_blocks.0.resnets.0.conv1.weight"
    );
    assert_eq!(
        map["lora_unet_down_blocks_0_resnets_0_conv1"].shape,
        vec![320, 320, 3, 3]
    );
    // No attention at SDXL's first level.
    assert!(!map.contains_key("lora_unet_down_blocks_0_attentions_0_proj_in"));

    let te = |i, name: &str, part| (Component::Clip(i), name.to_string(), part);
    let fc1 = te(0, "text_model.encoder.layers.3.mlp.fc1.weight", Part::Whole);
    for key in [
        "lora_te1_text_model_encoder_layers_3_mlp_fc1",
        "lora_te_text_model_encoder_layers_3_mlp_fc1",
        "text_encoder.text_model.encoder.layers.3.mlp.fc1",
        "text_encoders.clip_l.transformer.text_model.encoder.layers.3.mlp.fc1",
    ] {
        assert_eq!(target(key), fc1, "{key}");
    }
    let in_proj = "text_model.encoder.layers.31.self_attn.in_proj.weight";
    for (i, p) in ["q", "k", "v"].iter().enumerate() {
        for key in [
            format!("lora_te2_text_model_encoder_layers_31_self_attn_{p}_proj"),
            format!("text_encoder_2.text_model.encoder.layers.31.self_attn.{p}_proj"),
            format!("text_encoders.clip_g.transformer.text_model.encoder.layers.31.self_attn.{p}_proj"),
        ] {
            assert_eq!(target(&key), te(1, in_proj, Part::Third(i)), "{key}");
            assert_eq!(map[&key].shape, vec![1280, 1280]);
        }
    }
    assert_eq!(
        target("lora_te2_text_model_encoder_layers_0_mlp_fc2"),
        te(1, "text_model.encoder.layers.0.mlp.fc2.weight", Part::Whole)
    );
    assert_eq!(
        target("lora_te2_text_projection"),
        te(1, "text_projection.in_out", Part::Transposed)
    );
    // The refiner's bigG alone answers to kohya's single-encoder names.
    let refiner = targets(&ModelConfig::sdxl_refiner());
    assert_eq!(
        refiner["lora_te_text_model_encoder_layers_0_self_attn_v_proj"].part,
        Part::Third(2)
    );
    assert!(!refiner.contains_key("lora_te2_text_model_encoder_layers_0_self_attn_v_proj"));
}

#[test]
fn a_te2_q_proj_patch_changes_exactly_the_q_rows_of_in_proj() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny_sdxl();
    let d = cfg.text[1].width;
    let key = "lora_te2_text_model_encoder_layers_1_self_attn_q_proj";
    let (up, down) = (ramp(d * 2, -0.5, 0.01), ramp(2 * d, 0.3, -0.007));
    let lora = lora_file(
        dir.path(),
        "q.safetensors",
        &[
            (format!("{key}.lora_up.weight"), vec![d, 2], up.clone()),
            (format!("{key}.lora_down.weight"), vec![2, d], down.clone()),
            (format!("{key}.alpha"), vec![], vec![1.0]),
        ],
    );
    lora.check_fits(&cfg).unwrap();
    let before = tiny_sdxl_component(dir.path(), Component::Clip(1));
    let mut after = before.clone();
    assert_eq!(lora.apply(0.5, Component::Clip(1), &cfg, &mut after).unwrap(), 1);
    let in_proj = "text_model.encoder.layers.1.self_attn.in_proj.weight";
    assert_eq!(changed(&before, &after), BTreeSet::from([in_proj.to_string()]));
    let rows = |t: &Tensor, from: usize| t.narrow(0, from, d).unwrap();
    for third in [1, 2] {
        assert_eq!(
            crate::max_abs_diff(&rows(&after[in_proj], third * d), &rows(&before[in_proj], third * d)),
            0.0
        );
    }
    // strength 0.5, alpha 1 over rank 2: a quarter of up @ down.
    let up = Tensor::from_slice(&up, (d, 2), &Device::Cpu).unwrap();
    let down = Tensor::from_slice(&down, (2, d), &Device::Cpu).unwrap();
    let expected = (up.matmul(&down).unwrap() * 0.25).unwrap();
    let moved = (rows(&after[in_proj], 0) - rows(&before[in_proj], 0)).unwrap();
    assert!(crate::max_abs_diff(&moved, &expected) < 1e-6);
    // The other encoders and the UNet are untouched by it.
    let mut clip_l = tiny_sdxl_component(dir.path(), Component::Clip(0));
    assert_eq!(lora.apply(1.0, Component::Clip(0), &cfg, &mut clip_l).unwrap(), 0);
}

#[test]
fn a_text_projection_patch_is_added_transposed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny_sdxl();
    let d = cfg.text[1].width;
    let key = "lora_te2_text_projection";
    let (up, down) = (ramp(d, 0.1, 0.01), ramp(d, -0.2, 0.003));
    let lora = lora_file(
        dir.path(),
        "projection.safetensors",
        &[
            (format!("{key}.lora_up.weight"), vec![d, 1], up.clone()),
            (format!("{key}.lora_down.weight"), vec![1, d], down.clone()),
        ],
    );
    let before = tiny_sdxl_component(dir.path(), Component::Clip(1));
    let mut after = before.clone();
    lora.apply(1.0, Component::Clip(1), &cfg, &mut after).unwrap();
    let name = "text_projection.in_out";
    let moved = (&after[name] - &before[name]).unwrap();
    // ComfyUI's weight is [out, in]: the update's (row o, column i) is weft's (i, o).
    let expected = up[3] * down[5];
    let got: f32 = moved.get(5).unwrap().get(3).unwrap().to_scalar().unwrap();
    assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
}

#[test]
fn a_tiny_sdxl_lora_changes_the_unet_and_both_encoders_and_strength_zero_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny_sdxl();
    let path = dir.path().join("sdxl-lora.safetensors");
    write_random_lora(&path, &cfg, 1, 4).unwrap();
    let lora = Lora::read(&path, "sdxl-lora.safetensors").unwrap();
    assert!(lora
        .patches
        .keys()
        .any(|k| k.starts_with("lora_unet_input_blocks_4_1_")));
    assert!(lora.patches.keys().any(|k| k.starts_with("lora_te2_")));
    lora.check_fits(&cfg).unwrap();
    for component in [Component::Unet, Component::Clip(0), Component::Clip(1)] {
        let before = tiny_sdxl_component(dir.path(), component);
        let mut after = before.clone();
        let applied = lora.apply(1.0, component, &cfg, &mut after).unwrap();
        let moved = changed(&before, &after);
        assert!(!moved.is_empty(), "{component:?}");
        assert!(applied >= moved.len(), "{component:?}");
        if component == Component::Unet {
            // Transformer weights, the 1x1-shaped linear projections and LoCon's 3x3 convolutions.
            for name in [
                "mid_block.attentions.0.transformer_blocks.1.attn2.to_k.weight",
                "down_blocks.1.attentions.0.proj_in.weight",
                "up_blocks.2.resnets.1.conv2.weight",
            ] {
                assert!(moved.contains(name), "{name} unchanged");
            }
        }
        let mut same = before.clone();
        assert_eq!(lora.apply(0.0, component, &cfg, &mut same).unwrap(), 0);
        assert!(changed(&before, &same).is_empty());
    }
}

#[test]
fn loras_of_one_family_are_refused_by_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, cfg: &ModelConfig, rank| {
        let path = dir.path().join(name);
        write_random_lora(&path, cfg, 1, rank).unwrap();
        Lora::read(&path, name).unwrap()
    };
    for (lora, model) in [
        (
            write("tiny-sd1.safetensors", &ModelConfig::tiny(), 4),
            ModelConfig::tiny_sdxl(),
        ),
        (
            write("tiny-sdxl.safetensors", &ModelConfig::tiny_sdxl(), 4),
            ModelConfig::tiny(),
        ),
        (write("sd1.safetensors", &ModelConfig::sd1(), 1), ModelConfig::sdxl()),
        (write("sdxl.safetensors", &ModelConfig::sdxl(), 1), ModelConfig::sd1()),
        (
            write("refiner.safetensors", &ModelConfig::sdxl_refiner(), 1),
            ModelConfig::sdxl(),
        ),
    ] {
        let refused = lora.check_fits(&model).unwrap_err();
        assert_eq!(refused.code(), "invalid_model");
        assert!(refused.to_string().starts_with(&lora.name), "{refused}");
        // Applying checks too, and never panics.
        let mut none = HashMap::new();
        for component in [Component::Unet, Component::Clip(0)] {
            let _ = lora.apply(1.0, component, &model, &mut none);
        }
    }
}

#[test]
fn peft_names_alpha_and_locon_convolutions_patch_as_comfyui_does() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny_sdxl();
    let before = tiny_sdxl_component(dir.path(), Component::Unet);
    let q = "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight";
    let c = before[q].dim(0).unwrap();
    let peft = "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.processor.to_q";
    let kohya = "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q";
    let (up, down) = (ramp(c * 2, 0.2, -0.003), ramp(2 * c, -0.1, 0.002));
    let apply = |tensors: &[Named]| {
        let lora = lora_file(dir.path(), "l.safetensors", tensors);
        let mut after = before.clone();
        lora.apply(1.0, Component::Unet, &cfg, &mut after).unwrap();
        (&after[q] - &before[q]).unwrap()
    };
    let peft_moved = apply(&[
        (format!("{peft}.lora_B.weight"), vec![c, 2], up.clone()),
        (format!("{peft}.lora_A.weight"), vec![2, c], down.clone()),
    ]);
    let kohya_moved = apply(&[
        (format!("{kohya}.lora_up.weight"), vec![c, 2], up.clone()),
        (format!("{kohya}.lora_down.weight"), vec![2, c], down.clone()),
        (format!("{kohya}.alpha"), vec![], vec![1.0]),
    ]);
    // No alpha is alpha = rank; alpha 1 of rank 2 halves the update.
    assert!(crate::max_abs_diff(&(kohya_moved * 2.0).unwrap(), &peft_moved) < 1e-6);

    // LoCon: a [rank, in, 3, 3] down and [out, rank, 1, 1] up patch the 3x3 convolution.
    let conv = "down_blocks.0.resnets.0.conv1.weight";
    let dims = before[conv].dims().to_vec();
    let (out, inputs) = (dims[0], dims[1]);
    let key = "lora_unet_input_blocks_1_0_in_layers_2";
    let (up, down) = (ramp(out, 0.05, 0.001), ramp(inputs * 9, -0.03, 0.0005));
    let lora = lora_file(
        dir.path(),
        "locon.safetensors",
        &[
            (format!("{key}.lora_up.weight"), vec![out, 1, 1, 1], up.clone()),
            (format!("{key}.lora_down.weight"), vec![1, inputs, 3, 3], down.clone()),
        ],
    );
    let mut after = before.clone();
    lora.apply(1.0, Component::Unet, &cfg, &mut after).unwrap();
    let moved = (&after[conv] - &before[conv]).unwrap();
    let got: f32 = moved
        .get(3)
        .unwrap()
        .get(2)
        .unwrap()
        .get(1)
        .unwrap()
        .get(0)
        .unwrap()
        .to_scalar()
        .unwrap();
    let expected = up[3] * down[2 * 9 + 3];
    assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
}

#[test]
fn dora_and_other_adapters_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny_sdxl();
    let key = "lora_unet_middle_block_1_transformer_blocks_0_attn1_to_q";
    let c = 64;
    let dora = lora_file(
        dir.path(),
        "dora.safetensors",
        &[
            (format!("{key}.lora_up.weight"), vec![c, 1], vec![0.1; c]),
            (format!("{key}.lora_down.weight"), vec![1, c], vec![0.1; c]),
            (format!("{key}.dora_scale"), vec![c, 1], vec![1.0; c]),
        ],
    );
    let refused = dora.check_fits(&cfg).unwrap_err();
    assert_eq!(refused.code(), "invalid_model");
    assert!(refused.to_string().contains("DoRA"), "{refused}");

    let path = dir.path().join("loha.safetensors");
    let loha: Vec<Named> = ["hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"]
        .iter()
        .map(|t| (format!("{key}.{t}"), vec![1, 1], vec![0.0]))
        .collect();
    write_f32_safetensors(&path, &loha, &BTreeMap::new()).unwrap();
    let refused = Lora::read(&path, "loha.safetensors").unwrap_err();
    assert_eq!(refused.code(), "invalid_model");
    assert!(refused.to_string().contains("LoHa"), "{refused}");
}

#[test]
fn sd1_loras_fit_their_layout_and_not_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-lora.safetensors");
    write_random_lora(&path, &ModelConfig::tiny(), 1, 4).unwrap();
    let lora = Lora::read(&path, "tiny-lora.safetensors").unwrap();
    lora.check_fits(&ModelConfig::tiny()).unwrap();
    // The names are SD1's, the shapes are not.
    assert_eq!(
        lora.check_fits(&ModelConfig::sd1()).unwrap_err().code(),
        "invalid_model"
    );

    let ckpt = dir.path().join("tiny.safetensors");
    crate::models::write_random_checkpoint(&ckpt, &ModelConfig::tiny(), 2).unwrap();
    let cfg = ModelConfig::tiny();
    for component in [Component::Unet, Component::Clip(0)] {
        let before = load_component(&ckpt, &cfg, component, &Device::Cpu).unwrap();
        let mut after = before.clone();
        let applied = lora.apply(1.0, component, &cfg, &mut after).unwrap();
        assert!(applied > 0);
        assert_eq!(changed(&before, &after).len(), applied);
    }
    // Shapes of another layout are refused.
    let sd1_shaped = dir.path().join("sd1-lora.safetensors");
    write_random_lora(&sd1_shaped, &ModelConfig::sd1(), 1, 1).unwrap();
    let other = Lora::read(&sd1_shaped, "sd1-lora.safetensors").unwrap();
    let mut unet = load_component(&ckpt, &cfg, Component::Unet, &Device::Cpu).unwrap();
    assert_eq!(
        other.apply(1.0, Component::Unet, &cfg, &mut unet).unwrap_err().code(),
        "invalid_model"
    );

    // A file without LoRA weights, or with none that fit, is refused.
    let junk = dir.path().join("junk.safetensors");
    write_f32_safetensors(
        &junk,
        &[("lora_unet_nothing_here.lora_down.weight".into(), vec![1, 1], vec![0.0])],
        &BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(Lora::read(&junk, "junk").unwrap_err().code(), "invalid_model");
    let stray = lora_file(
        dir.path(),
        "stray",
        &[
            ("lora_unet_nowhere.lora_down.weight".into(), vec![1, 1], vec![0.0]),
            ("lora_unet_nowhere.lora_up.weight".into(), vec![1, 1], vec![0.0]),
        ],
    );
    assert_eq!(stray.check_fits(&cfg).unwrap_err().code(), "invalid_model");
}
