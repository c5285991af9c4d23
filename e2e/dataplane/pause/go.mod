module nodewarden.io/e2e/dataplane/pause

go 1.26.0
