/* The engine's public configuration: its defaults (gradsync/engine.h). */
#include <gradsync/engine.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void gs_engine_config_defaults(gs_engine_config_t *cfg)
{
  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->coord.host, sizeof(cfg->coord.host), "127.0.0.1");
  cfg->coord.job = "local";
  cfg->world_size = 1;
  if (gethostname(cfg->node, sizeof(cfg->node)) != 0 || !cfg->node[0])
    snprintf(cfg->node, sizeof(cfg->node), "localhost");
  cfg->node[sizeof(cfg->node) - 1] = '\0'; /* gethostname may truncate without one */
  snprintf(cfg->device, sizeof(cfg->device), "cpu");
  snprintf(cfg->backend, sizeof(cfg->backend), "host");
  snprintf(cfg->comm_host, sizeof(cfg->comm_host), "127.0.0.1");
  cfg->pack_threshold = 10 << 20;
  cfg->reduce = GS_REDUCE_MEAN;
  gs_sgd_config_default(&cfg->sgd);
  cfg->bcast_period = 0;
  cfg->checkpoint_keep = 3;
  cfg->join_timeout_ms = 5 * 60 * 1000;
  cfg->rpc_timeout_ms = 30 * 1000;
  cfg->comm_timeout_ms = 2 * 60 * 1000;
}
