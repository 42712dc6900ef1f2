package router

import (
	"strings"
	"testing"
	"time"
)

// validate names the field that is wrong, each bound on its own field.
func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		set   func(c *Config)
	}{
		{"PrefillPolicy", func(c *Config) { c.PrefillPolicy = "fastest" }},
		{"DecodePolicy", func(c *Config) { c.DecodePolicy = "fastest" }},
		{"MaxBodyBytes", func(c *Config) { c.MaxBodyBytes = -1 }},
		{"MaxInflight", func(c *Config) { c.MaxInflight = -1 }},
		{"MaxResponseBytes", func(c *Config) { c.MaxResponseBytes = -1 }},
		{"MaxAttempts", func(c *Config) { c.MaxAttempts = -1 }},
		{"RetryBackoff", func(c *Config) { c.RetryBackoff = -time.Second }},
		{"RetryBackoffMax", func(c *Config) { c.RetryBackoffMax = -time.Second }},
		{"BreakerFailures", func(c *Config) { c.BreakerFailures = -1 }},
		{"BreakerCooldown", func(c *Config) { c.BreakerCooldown = -time.Second }},
		{"ConnectTimeout", func(c *Config) { c.ConnectTimeout = -time.Second }},
		{"PrefillTimeout", func(c *Config) { c.PrefillTimeout = -time.Second }},
		{"DecodeFirstByteTimeout", func(c *Config) { c.DecodeFirstByteTimeout = -time.Second }},
		{"MaxIdleConnsPerHost", func(c *Config) { c.MaxIdleConnsPerHost = -1 }},
		{"CacheAwarePrefixBytes", func(c *Config) { c.CacheAwarePrefixBytes = -1 }},
		{"CacheAwareBalanceAbs", func(c *Config) { c.CacheAwareBalanceAbs = -1 }},
		{"CacheAwareBalanceRel", func(c *Config) { c.CacheAwareBalanceRel = 0.5 }},
		{"CacheAwareVirtualNodes", func(c *Config) { c.CacheAwareVirtualNodes = -1 }},
		{"CacheAwareVirtualNodes", func(c *Config) { c.CacheAwareVirtualNodes = 1025 }},
		{"APIKeys[1]", func(c *Config) { c.APIKeys = []string{"k", ""} }},
	} {
		c := Config{}
		tc.set(&c)
		c = c.WithDefaults()
		err := c.validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.field+":") {
			t.Errorf("%s out of bounds: error %v, want one naming %s", tc.field, err, tc.field)
		}
	}
	if c := (Config{}).WithDefaults(); c.validate() != nil {
		t.Fatalf("defaults refused: %v", c.validate())
	}
}
