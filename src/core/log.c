/* DPSAMPLING_DEBUG=WARN|INFO logging to stderr (quiet by default, like NCCL_DEBUG). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

int dpsLogLevel(void) {
  /* Read every time: cheap, and tests may change it; only logging paths call this. */
  const char* v = getenv("DPSAMPLING_DEBUG");
  if (v == NULL || v[0] == '\0') return DPS_LOG_NONE;
  if (strcasecmp(v, "INFO") == 0 || strcasecmp(v, "TRACE") == 0) return DPS_LOG_INFO;
  if (strcasecmp(v, "WARN") == 0) return DPS_LOG_WARN;
  return DPS_LOG_NONE;
}

void dpsLog(int level, const char* fmt, ...) {
  if (dpsLogLevel() < level) return;
  char msg[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "dpsampling %s pid %d: %s\n", level == DPS_LOG_INFO ? "INFO" : "WARN",
          (int)getpid(), msg);
}
