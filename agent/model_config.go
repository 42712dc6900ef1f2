package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ModelConfig is the KV shape of a model as its Hugging Face config.json
// states it.
type ModelConfig struct {
	NumLayers  int
	NumKVHeads int
	HeadDim    int
	IsMLA      bool
	// TorchDType is the weights' dtype ("bfloat16"), what an engine's KV
	// dtype "auto" means; empty when config.json does not say.
	TorchDType string
}

// hfConfig is the part of config.json read. Multimodal models nest the
// language model's fields under text_config.
type hfConfig struct {
	NumHiddenLayers   int       `json:"num_hidden_layers"`
	NumAttentionHeads int       `json:"num_attention_heads"`
	NumKeyValueHeads  int       `json:"num_key_value_heads"`
	HeadDim           int       `json:"head_dim"`
	HiddenSize        int       `json:"hidden_size"`
	KVLoraRank        *int      `json:"kv_lora_rank"`
	QKRopeHeadDim     int       `json:"qk_rope_head_dim"`
	TorchDType        string    `json:"torch_dtype"`
	DType             string    `json:"dtype"`
	TextConfig        *hfConfig `json:"text_config"`
}

// ReadModelConfig reads dir/config.json. An MLA model (kv_lora_rank set,
// as DeepSeek's) keeps one latent KV head of kv_lora_rank +
// qk_rope_head_dim per token, which is what SGLang's MLA KV pool stores.
func ReadModelConfig(dir string) (ModelConfig, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return ModelConfig{}, fmt.Errorf("read model config: %w", err)
	}
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return ModelConfig{}, fmt.Errorf("parse model config %s: %w", path, err)
	}
	if c.NumHiddenLayers == 0 && c.TextConfig != nil {
		dt := c.TorchDType
		c = *c.TextConfig
		if c.TorchDType == "" {
			c.TorchDType = dt
		}
	}
	bad := func(field string) error {
		return fmt.Errorf("model config %s: %s is missing or not positive", path, field)
	}
	out := ModelConfig{NumLayers: c.NumHiddenLayers, TorchDType: c.TorchDType}
	if out.TorchDType == "" {
		out.TorchDType = c.DType // newer transformers write dtype
	}
	if out.NumLayers <= 0 {
		return ModelConfig{}, bad("num_hidden_layers")
	}
	if c.KVLoraRank != nil && *c.KVLoraRank > 0 {
		out.IsMLA, out.NumKVHeads, out.HeadDim = true, 1, *c.KVLoraRank+c.QKRopeHeadDim
		return out, nil
	}
	out.NumKVHeads = c.NumKeyValueHeads
	if out.NumKVHeads == 0 {
		out.NumKVHeads = c.NumAttentionHeads // no GQA: one KV head per head
	}
	if out.NumKVHeads <= 0 {
		return ModelConfig{}, bad("num_key_value_heads (or num_attention_heads)")
	}
	out.HeadDim = c.HeadDim
	if out.HeadDim == 0 && c.NumAttentionHeads > 0 {
		out.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if out.HeadDim <= 0 {
		return ModelConfig{}, bad("head_dim (or hidden_size and num_attention_heads)")
	}
	return out, nil
}

// agrees checks that the model directory holds the model the engine
// serves, where both name it comparably: two local paths must be the same
// directory, and a Hugging Face cache snapshot (…/models--org--name/
// snapshots/rev) must be of the repository the engine loaded (org/name).
// A contradiction names both values.
func (c ModelConfig) agrees(dir, engineURL, enginePath string) error {
	if enginePath == "" {
		return nil
	}
	if repo, ok := hfCacheRepo(dir); ok {
		if !filepath.IsAbs(enginePath) && strings.Count(enginePath, "/") == 1 && enginePath != repo {
			return fmt.Errorf("model dir %s holds %s, but engine %s serves model_path %s", dir, repo, engineURL, enginePath)
		}
		return nil
	}
	if filepath.IsAbs(enginePath) && filepath.IsAbs(dir) && filepath.Clean(dir) != filepath.Clean(enginePath) {
		return fmt.Errorf("model dir %s is not the engine's: engine %s serves model_path %s", dir, engineURL, enginePath)
	}
	return nil
}

// hfCacheRepo returns org/name for a path inside a Hugging Face hub cache
// entry (models--org--name).
func hfCacheRepo(dir string) (string, bool) {
	for _, part := range strings.Split(filepath.ToSlash(filepath.Clean(dir)), "/") {
		if rest, ok := strings.CutPrefix(part, "models--"); ok {
			return strings.Replace(rest, "--", "/", 1), true
		}
	}
	return "", false
}
