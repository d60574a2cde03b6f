# Builds the exit-guard image: a static binary on distroless, running as non-root.
FROM golang:1.26 AS build
WORKDIR /src
# Dependencies in their own layer, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY main.go ./
COPY completionstore/ completionstore/
COPY internal/argo/ internal/argo/
COPY internal/certs/ internal/certs/
COPY webhook/ webhook/
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags "-s -w" -o /exit-guard .

FROM gcr.io/distroless/static:nonroot
COPY --from=build /exit-guard /exit-guard
# 65532 is distroless' nonroot user.
USER 65532:65532
ENTRYPOINT ["/exit-guard"]
